"""Structure figures of the source tree (issue 16's before/after table), read from the code with ``ast``.

    python scripts/structure_report.py [ROOT] [--json] [--check]

``--check`` (run by .ci/run) also exits 1 when the tree breaks a rule the figures track: an import cycle among
specframe's modules, a plugin method called by its name in a string, a key spelled with a NUL in a string, or a
plugin/contrib module importing ``specframe.bench``.

Prints, for the tree at ROOT (default: this checkout):

- the decode loop's length: lines of ``Request.step`` in specframe/decode/engine.py (def line to last line);
- modules that write request metrics: an assignment or augmented assignment to a field of ``RequestMetrics`` /
  ``ProposerMetrics`` (matched by field name on an object spelled ``metrics``, ``m``, ``own``, ``pm`` or
  ``*.metrics``), or a call of their ``record*`` methods, outside specframe/decode/metrics.py's own classes;
- resolution paths: modules outside specframe/config.py that turn config entries into plugin classes themselves
  (calls of ``registry.proposer`` / ``merge_policy`` / ``router`` or of the per-kind ``resolve_*`` helpers, each
  with its own rule for when merge and router count), and the modules that use the one path,
  ``config.resolve_plugins``;
- import cycles among specframe's modules (every ``import`` that runs, top-level or inside a function; not those
  under ``if TYPE_CHECKING:``), and plugins or
  contrib modules that import ``specframe.bench``;
- functions over 60 lines in specframe/, plugins/ and contrib/;
- token-trie builders: top-level functions or classes that build a trie of their own, found by its child
  index, a ``dict[tuple[int, int], int]`` from (parent node, token) to node;
- (issue 27) the floors: modules at the top of specframe/, its sub-packages; owners of the cost curve v(n)
  (modules defining a function or method that computes it: ``v``, ``_v``, ``v_at``, ``v_fixed``, ``interpolate``,
  ``seconds`` (a forward's modeled time), ``predicted_speedup`` or ``measure_cost_curve``) and the annotation of
  ``TargetInfo.cost``; the specframe modules that plugins/ and
  contrib/ import; identifiers (not strings) that still use a name the glossary replaced (docs/how-it-works.md,
  "Vocabulary"); class names defined in two specframe modules.
- (issue 41) the largest modules and classes (lines; a class's methods and, for a config model, its fields); per
  plugin method (the proposer's, merge policy's and router's contract members) its call sites a grep finds,
  ``.name(`` outside a ``def``, and the places that call it by its name in a string (``getattr(obj, "name")``, or the
  name handed to a dispatching helper); ``getattr(obj, "attr", default)`` reads; string constants holding a NUL
  (keys spelled in strings); config models that allow extra keys; tracked files by room (git ls-files).
- (issue 70) ``Request.__init__``'s parameters, the ``Specframe`` class's lines, specframe/config.py's lines; upward
  imports between floors (``FLOORS``: kernel (+ files) < target < decode < host < faces, docs/how-it-works.md's floor
  table): an import that runs from a module on a lower floor to one on a higher floor, and modules no floor names.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

METRIC_FIELDS = {
    "prompt_tokens", "new_tokens", "target_forwards", "drafted_nodes", "accepted_nodes", "proposer_faults",
    "proposer_fault_kinds", "proposer_disabled", "wall_s", "prefill_s", "propose_s", "forward_s", "verify_s",
    "drafted_by_depth", "accepted_by_depth", "steps", "skipped_steps", "proposed_nodes", "accepted_alone", "wasted_nodes", "draft_s", "faults", "disabled",
    "drafted" + "_tokens", "accepted" + "_tokens", "drafted_by" + "_position", "accepted_by" + "_position",  # before #27
}
METRIC_OWNERS = re.compile(r"^(self\.)?(metrics|m|own|pm|[a-z_]+\.metrics)$")
RESOLVERS = {"resolve_proposers", "resolve_merge", "resolve_router", "_resolve_proposers", "_resolve_merge",
             "_resolve_router"}
REGISTRY_LOOKUPS = {"proposer", "merge_policy", "router"}


def _modules(root: Path, folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for f in folders for p in (root / f).rglob("*.py") if "__pycache__" not in p.parts)


def _name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def loop_lines(root: Path) -> int:
    engine = root / "specframe/decode/engine.py"
    tree = ast.parse((engine if engine.exists() else root / "specframe/engine.py").read_text())
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name == "Request":
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "step":
                    return fn.end_lineno - fn.lineno + 1
    return -1


def _writes_metrics(node: ast.AST) -> bool:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    for t in targets:
        base = t.value if isinstance(t, ast.Subscript) else t
        if isinstance(base, ast.Attribute) and base.attr in METRIC_FIELDS:
            if METRIC_OWNERS.match(ast.unparse(base.value)):
                return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        f = node.func
        if f.attr in ("record", "record_step", "add", "add_step") and METRIC_OWNERS.match(ast.unparse(f.value)):
            return True
        if f.attr in ("append", "extend", "__setitem__") and isinstance(f.value, ast.Attribute) \
                and f.value.attr in METRIC_FIELDS and METRIC_OWNERS.match(ast.unparse(f.value.value)):
            return True
    return False


def metric_writers(root: Path) -> list[str]:
    out = []
    for path in _modules(root, ("specframe", "plugins")):
        tree = ast.parse(path.read_text())
        skip: set[int] = set()
        if path.name == "metrics.py" and path.parent.name in ("specframe", "decode"):  # the metrics classes' own methods
            for cls in tree.body:
                if isinstance(cls, ast.ClassDef) and cls.name in ("RequestMetrics", "ProposerMetrics"):
                    skip.update(id(n) for n in ast.walk(cls))
        if any(_writes_metrics(n) for n in ast.walk(tree) if id(n) not in skip):
            out.append(str(path.relative_to(root)))
    return out


def resolution_paths(root: Path) -> list[str]:
    out = []
    for path in _modules(root, ("specframe", "plugins")):
        if path.relative_to(root).as_posix() == "specframe/config.py":
            continue
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                on_registry = isinstance(f, ast.Attribute) and "registry" in ast.unparse(f.value).lower()
                if name in RESOLVERS or (name in REGISTRY_LOOKUPS and on_registry) or (
                        isinstance(f, ast.Attribute) and ast.unparse(f.value) in ("reg", "self.registry", "registry")
                        and name in REGISTRY_LOOKUPS):
                    out.append(str(path.relative_to(root)))
                    break
    return out


def one_path_callers(root: Path) -> list[str]:
    out = []
    for path in _modules(root, ("specframe", "plugins")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) or getattr(n.func, "attr", None))
               == "resolve_plugins" for n in ast.walk(tree)):
            out.append(str(path.relative_to(root)))
    return out


def _imports(root: Path, path: Path, tree: ast.AST) -> set[str]:
    me = _name(root, path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    typing_only = {id(m) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)
                   for b in n.body for m in ast.walk(b)}
    for n in ast.walk(tree):
        if id(n) in typing_only:  # `if TYPE_CHECKING:` imports never run
            continue
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package.split(".")
                base = base[: len(base) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in n.names)
    return out


def import_cycles(root: Path) -> tuple[list[list[str]], list[str]]:
    paths = _modules(root, ("specframe",))
    names = {_name(root, p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps = set()
        for imp in _imports(root, path, ast.parse(path.read_text())):
            while imp and imp not in names:
                imp = imp.rsplit(".", 1)[0] if "." in imp else ""
            if imp and imp != name and not name.startswith(imp + ".") and imp != "specframe":
                deps.add(imp)
        graph[name] = deps
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    on_bench = []
    for path in _modules(root, ("plugins", "contrib")):
        if any(i == "specframe.bench" or i.startswith("specframe.bench.")
               for i in _imports(root, path, ast.parse(path.read_text()))):
            on_bench.append(str(path.relative_to(root)))
    return sccs, on_bench


def long_functions(root: Path, limit: int = 60) -> list[tuple[str, int]]:
    out = []
    for path in _modules(root, ("specframe", "plugins", "contrib")):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = n.end_lineno - n.lineno + 1
                if lines > limit:
                    out.append((f"{path.relative_to(root)}:{n.name}", lines))
    return sorted(out, key=lambda x: -x[1])


def trie_builders(root: Path) -> list[str]:
    """Where a token trie is built: a ``(parent node, token) -> node`` dict (annotated
    ``dict[tuple[int, int], int]``), named by the enclosing top-level class or function."""
    out = []
    for path in _modules(root, ("specframe", "plugins", "contrib")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        for top in tree.body:
            if not isinstance(top, (ast.FunctionDef, ast.ClassDef)):
                continue
            if any(isinstance(n, ast.AnnAssign) and ast.unparse(n.annotation).replace(" ", "")
                   == "dict[tuple[int,int],int]" for n in ast.walk(top)):
                out.append(f"{rel}:{top.name}")
    return out


OLD_NAMES = ("drafted" + "_tokens", "accepted" + "_tokens", "mean_accepted" + "_length", "drafted_by" + "_position",
             "accepted_by" + "_position")  # (spelled in pieces so that a rename of the names leaves this list)
V_NAMES = re.compile(r"^(v|_v|v_at|v_fixed|interpolate|seconds|predicted_speedup|measure_cost_curve)$")


def floors(root: Path) -> dict[str, list[str]]:
    top = sorted(p.name for p in (root / "specframe").glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in (root / "specframe").iterdir() if (p / "__init__.py").exists())
    return {"top_modules": top, "folders": folders}


# (issue 70) specframe's floors, lowest first, as docs/how-it-works.md's floor table names them (imports run
# downward): a module may import its own floor and those below. Top-level modules and sub-packages by their first
# name; where the table is silent, by what they import and who imports them (grammar: constraint engines over the
# contracts; learned: drafter components that target.models reads; block_drafts: a kernel function). The public face
# (specframe/__init__.py, services.py) re-exports every floor and has none.
FLOORS: dict[str, int] = {
    **dict.fromkeys(("contracts", "acceptance", "token_tree", "sampling", "errors", "hookspecs", "block_drafts",
                     "grammar", "io"), 0),  # kernel, and the files room beside it (io reads errors)
    **dict.fromkeys(("target", "learned"), 1),
    "decode": 2,
    **dict.fromkeys(("registry", "config", "installed", "instance_pool", "request_options", "request_job",
                     "shared_weights"), 3),  # host: wiring config -> plugins -> engine
    **dict.fromkeys(("api", "cli", "bench", "replay", "serve", "training", "datastore", "integrations", "testing",
                     "__main__"), 4),  # faces
}
FLOOR_NAMES = ("kernel", "target", "decode", "host", "faces")
PUBLIC_FACE = {"specframe", "specframe.services"}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 and parts[0] == "specframe" else None


def upward_imports(root: Path) -> dict[str, list[str]]:
    """Imports that run (as for import cycles) from a module on a lower floor to one on a higher floor
    (``importer -> imported``), and the specframe modules no floor names."""
    paths = _modules(root, ("specframe",))
    names = {_name(root, p): p for p in paths}
    up, unplaced = set(), set()
    for name, path in names.items():
        mine = _floor(name)
        if mine is None:
            if name not in PUBLIC_FACE:
                unplaced.add(name)
            continue
        for imp in _imports(root, path, ast.parse(path.read_text())):
            while imp and imp not in names:
                imp = imp.rsplit(".", 1)[0] if "." in imp else ""
            theirs = _floor(imp) if imp else None
            if theirs is not None and theirs > mine:
                up.add(f"{name} ({FLOOR_NAMES[mine]}) -> {imp} ({FLOOR_NAMES[theirs]})")
    return {"upward_imports": sorted(up), "unplaced_modules": sorted(unplaced)}


def request_figures(root: Path) -> dict[str, int]:
    """(issue 70) ``Request.__init__``'s parameters (but ``self``), the lines of class ``Specframe`` (class line to
    last line) and of specframe/config.py."""
    out = {"request_init_params": -1, "specframe_class_lines": -1, "config_lines": -1}
    engine = root / "specframe/decode/engine.py"
    for node in ast.walk(ast.parse(engine.read_text())) if engine.exists() else ():
        if isinstance(node, ast.ClassDef) and node.name == "Request":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    a = fn.args
                    out["request_init_params"] = len(a.posonlyargs + a.args + a.kwonlyargs) - 1 + bool(
                        a.vararg) + bool(a.kwarg)
    api = root / "specframe/api.py"
    for node in ast.walk(ast.parse(api.read_text())) if api.exists() else ():
        if isinstance(node, ast.ClassDef) and node.name == "Specframe":
            out["specframe_class_lines"] = node.end_lineno - node.lineno + 1
    config = root / "specframe/config.py"
    if config.exists():
        out["config_lines"] = len(config.read_text().splitlines())
    return out


def cost_owners(root: Path) -> tuple[list[str], str]:
    owners: dict[str, list[str]] = {}
    annotation = "?"
    for path in _modules(root, ("specframe", "plugins", "contrib")):
        rel = path.relative_to(root).as_posix()
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.FunctionDef) and V_NAMES.search(n.name):
                owners.setdefault(rel, []).append(n.name)
            if isinstance(n, ast.ClassDef) and n.name == "TargetInfo":
                for item in n.body:
                    if isinstance(item, ast.AnnAssign) and ast.unparse(item.target) == "cost":
                        annotation = ast.unparse(item.annotation)
    return [f"{m} ({', '.join(sorted(set(v)))})" for m, v in sorted(owners.items())], annotation


def plugin_imports(root: Path) -> list[str]:
    out: set[str] = set()
    for path in _modules(root, ("plugins", "contrib")):
        if "tests" in path.relative_to(root).parts:
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == "specframe":
                out.add(n.module)
            elif isinstance(n, ast.Import):
                out.update(a.name for a in n.names if a.name.split(".")[0] == "specframe")
    return sorted(out)


def old_names(root: Path) -> dict[str, int]:
    """Identifier uses (attributes, names, arguments, keywords; not string keys) of names the glossary replaced."""
    counts = dict.fromkeys(OLD_NAMES, 0)
    for path in _modules(root, ("specframe", "plugins", "contrib")):
        for n in ast.walk(ast.parse(path.read_text())):
            name = (n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name)
                    else n.arg if isinstance(n, (ast.arg, ast.keyword)) else None)
            if name in counts:
                counts[name] += 1
    return {k: v for k, v in counts.items() if v}


def same_name_classes(root: Path) -> list[str]:
    seen: dict[str, list[str]] = {}
    for path in _modules(root, ("specframe",)):
        for n in ast.parse(path.read_text()).body:
            if isinstance(n, ast.ClassDef):
                seen.setdefault(n.name, []).append(path.relative_to(root).as_posix())
    return [f"{k} ({', '.join(v)})" for k, v in sorted(seen.items()) if len(v) > 1]


PLUGIN_METHODS = ("start", "propose", "on_verified", "plan", "route", "revise", "on_step", "on_batch")
SOURCE = ("specframe", "plugins", "contrib")


def _sources(root: Path) -> list[tuple[Path, ast.AST, str]]:
    out = []
    for path in _modules(root, SOURCE):
        text = path.read_text()
        out.append((path, ast.parse(text), text))
    return out


def largest(root: Path, top: int = 8) -> dict[str, list[str]]:
    """The ``top`` largest modules (lines) and classes (lines, methods, annotated fields)."""
    files, classes = [], []
    for path, tree, text in _sources(root):
        rel = str(path.relative_to(root))
        files.append((text.count("\n"), rel))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
                fields = sum(isinstance(b, ast.AnnAssign) for b in node.body)
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}", methods, fields))
    files.sort(reverse=True)
    classes.sort(reverse=True)
    return {"largest_files": [f"{r} ({n})" for n, r in files[:top]],
            "largest_classes": [f"{r} ({n} lines, {m} methods, {f} fields)" for n, r, m, f in classes[:top]]}


_LABELS = {"call", "Call", "_noting"}  # callees whose string argument labels a direct call made next to them


def plugin_calls(root: Path) -> dict[str, dict[str, int]]:
    """Per plugin method: direct call sites (``x.name(...)``) and calls by name in a string, in specframe/ (the
    engine and the tools that drive plugins; the plugins' own bodies are not their callers). A string handed to a
    guard (``with guard.call("start"): p.start(state)``) or a call record only labels a direct call: not counted."""
    out = {m: {"direct": 0, "by_string": 0} for m in PLUGIN_METHODS}
    for path in _modules(root, ("specframe",)):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in out and not (isinstance(f.value, ast.Name)
                                                                        and f.value.id == "super"):
                out[f.attr]["direct"] += 1
            callee = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if callee in _LABELS:  # a guard's label (``guard.call("start")``) or a call record names the method
                continue
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in out:
                    out[a.value]["by_string"] += 1
    return out


def loose_reads(root: Path) -> dict[str, int]:
    """``getattr(obj, "attr", default)`` calls and NUL-holding string constants per folder; config models with
    ``extra="allow"``."""
    out = {"getattr_default": 0, "nul_keys": 0, "extra_allow_models": 0}
    for _, tree, _ in _sources(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and len(node.args) == 3:
                out["getattr_default"] += 1
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "\0" in node.value:
                out["nul_keys"] += 1
            elif isinstance(node, ast.keyword) and node.arg == "extra" and isinstance(node.value, ast.Constant) \
                    and node.value.value == "allow":
                out["extra_allow_models"] += 1
    return out


def rooms(root: Path) -> dict[str, int]:
    """Tracked files per top folder (run records are the files under docs/results, data/ or lab/)."""
    import subprocess

    try:
        names = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    out: dict[str, int] = {"all": len(names)}
    for n in names:
        top = n.split("/")[0] if "/" in n else "."
        out[top] = out.get(top, 0) + 1
    out["run_records"] = sum(n.startswith(("docs/results/", "data/", "lab/")) for n in names)
    out["docs_yaml"] = sum(n.startswith("docs/") and n.count("/") == 1 and n.endswith(".yaml") for n in names)
    out["scripts"] = sum(n.startswith("scripts/") and n.endswith((".py", ".sh")) for n in names)
    return out


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("--")]
    root = Path(args[0] if args else Path(__file__).resolve().parents[1]).resolve()
    cycles, on_bench = import_cycles(root)
    report = {
        "loop_lines": loop_lines(root),
        "metric_writers": metric_writers(root),
        "resolution_paths": resolution_paths(root),
        "resolve_plugins_callers": one_path_callers(root),
        "import_cycles": cycles,
        "plugins_importing_bench": on_bench,
        "functions_over_60_lines": long_functions(root),
        "trie_builders": trie_builders(root),
        **floors(root),
        "cost_owners": cost_owners(root)[0],
        "target_info_cost_type": cost_owners(root)[1],
        "plugin_imports": plugin_imports(root),
        "glossary_old_names": old_names(root),
        "same_name_classes": same_name_classes(root),
        **largest(root),
        "plugin_method_calls": plugin_calls(root),
        **loose_reads(root),
        "rooms": rooms(root),
        **request_figures(root),
        **upward_imports(root),
    }
    if "--json" in argv:
        print(json.dumps(report, indent=1))
        return
    print(f"tree: {root}")
    print(f"decode loop (Request.step): {report['loop_lines']} lines")
    for key in ("metric_writers", "resolution_paths", "resolve_plugins_callers", "plugins_importing_bench",
                "trie_builders", "top_modules", "folders", "cost_owners", "plugin_imports", "same_name_classes"):
        print(f"{key}: {len(report[key])}  {', '.join(report[key])}")
    print(f"import_cycles: {len(cycles)}  " + "; ".join(" <-> ".join(c) for c in cycles))
    print(f"target_info_cost_type: {report['target_info_cost_type']}")
    old = report["glossary_old_names"]
    print(f"glossary_old_names: {sum(old.values())}  " + ", ".join(f"{k} ({v})" for k, v in old.items()))
    fl = report["functions_over_60_lines"]
    print(f"functions_over_60_lines: {len(fl)}  " + ", ".join(f"{n} ({k})" for n, k in fl))
    for key in ("largest_files", "largest_classes"):
        print(f"{key}: " + ", ".join(report[key]))
    calls = report["plugin_method_calls"]
    print("plugin_method_calls (direct / by string): " + ", ".join(f"{m} {c['direct']}/{c['by_string']}"
                                                                   for m, c in calls.items()))
    print(f"getattr_default: {report['getattr_default']}  nul_keys: {report['nul_keys']}  "
          f"extra_allow_models: {report['extra_allow_models']}")
    print("rooms: " + ", ".join(f"{k} {v}" for k, v in report["rooms"].items()))
    print(f"Request.__init__ parameters: {report['request_init_params']}  Specframe class: "
          f"{report['specframe_class_lines']} lines  config.py: {report['config_lines']} lines")
    for key in ("upward_imports", "unplaced_modules"):
        print(f"{key}: {len(report[key])}  {', '.join(report[key])}")
    if "--check" in argv:
        broken = check(report)
        for line in broken:
            print(f"error: {line}", file=sys.stderr)
        if broken:
            raise SystemExit(1)


def check(report: dict) -> list[str]:
    """The rules ``--check`` enforces, one line per break (empty: none)."""
    out = [f"import cycle: {' <-> '.join(c)}" for c in report["import_cycles"]]
    out += [f"{m} is called by its name in a string {c['by_string']} time(s): call it directly inside a guard"
            for m, c in report["plugin_method_calls"].items() if c["by_string"]]
    if report["nul_keys"]:
        out.append(f"{report['nul_keys']} string constant(s) hold a NUL (keys spelled in strings): use a typed key")
    out += [f"{m} imports specframe.bench" for m in report["plugins_importing_bench"]]
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
