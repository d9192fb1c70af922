"""The public face: ``specframe`` exports what a user and a plugin author need (about 25 names),
``specframe.services`` what the engine offers a plugin beyond that, ``specframe.errors`` every error class; the names
that moved out of ``specframe`` still resolve there with a DeprecationWarning; the built-in plugins and contrib import
from these three only, and nothing moved."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import specframe
import specframe.errors
import specframe.services

from tests.fakes import ROOT

PUBLIC = {"specframe", "specframe.services", "specframe.errors"}
TOP = {
    # running
    "load", "Specframe", "SamplingParams",
    # writing a proposer
    "ProposerBase", "ProposerConfig", "DraftTree", "DecodeState", "TargetInfo", "VerifyOutcome", "Proposer",
    "Capabilities", "hookimpl",
    # writing a verifier
    "Verifier", "VerifyResult", "TargetModel",
    # combining proposers
    "MergePolicy", "MergePolicyBase", "MergePolicyConfig", "Router", "RouterBase", "RouterConfig", "ProposerStep",
    "StepReport",
    # errors
    "SpecframeError", "ConfigError", "DraftError",
}
# what specframe.__all__ held before the services moved behind specframe.services (each still resolves there)
FORMER = TOP | {
    "CacheError", "CostCurve", "DRAFT_SUFFIX", "Datastore", "DatastoreError", "Eagle3Drafter", "EagleDrafter",
    "Engine", "KVBuffer", "LlamaContext", "LlamaModel", "MedusaHeads", "ModelNotInstalledError",
    "PluginContractError", "PluginError", "ProposerTimeoutError", "PublishedMedusa", "Registry", "Retrieval",
    "SkipChoice", "TextBridge", "TokenTrie", "TraceError", "build_registry", "cache_length", "cached_skip_choice",
    "check_lossless", "check_skip", "children_of", "compact", "decoder_layers", "default_datastore", "file_sha256",
    "folder_key", "import_llama_cpp", "is_small_draft", "load_eagle3", "load_medusa", "load_model", "load_mtp",
    "load_small_draft", "model_directory", "mtp_layer_count", "new_cache", "node_depths", "probs_from_logits",
    "resolve_model", "rollback", "shared", "shared_tokens", "skipping", "tokenizer_directory", "tokenizer_info",
    "v_at",
}
MOVED = sorted(FORMER - TOP)


def _error_classes() -> set[str]:
    return {n for n, v in vars(specframe.errors).items()
            if inspect.isclass(v) and issubclass(v, specframe.SpecframeError)}


def test_the_top_level_is_about_25_names_and_each_resolves_without_a_warning():
    assert set(specframe.__all__) == TOP and len(specframe.__all__) == len(TOP)
    assert 22 <= len(TOP) <= 28
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        missing = [name for name in specframe.__all__ if not hasattr(specframe, name)]
    assert missing == []
    assert TOP <= set(dir(specframe))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        specframe.not_a_name  # noqa: B018


def test_the_services_resolve_and_an_unknown_name_raises():
    names = specframe.services.__all__
    assert len(set(names)) == len(names) and not set(names) & TOP
    assert [n for n in names if not hasattr(specframe.services, n)] == []
    assert set(names) <= set(dir(specframe.services))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        specframe.services.not_a_name  # noqa: B018


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_resolves_from_specframe_with_a_warning_naming_its_new_place(name):
    home = "specframe.errors" if name in _error_classes() else "specframe.services"
    new = getattr(sys.modules[home], name)
    with pytest.warns(DeprecationWarning, match=rf"^specframe\.{name} is moved: import it from {home} \(the old name goes in specframe 0\.3\.0\)$") as caught:
        old = getattr(specframe, name)
    assert old is new
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the caller
    assert name not in specframe.__all__ and name not in dir(specframe)


def test_from_specframe_import_a_moved_name_warns_once_at_the_import():
    with pytest.warns(DeprecationWarning, match="specframe.TokenTrie is moved") as caught:
        from specframe import TokenTrie
    assert TokenTrie is specframe.services.TokenTrie
    assert [(w.filename, str(w.message)) for w in caught] == [
        (__file__, "specframe.TokenTrie is moved: import it from specframe.services (the old name goes in specframe 0.3.0)")]


def test_the_former_error_names_live_in_specframe_errors():
    assert {n for n in FORMER if n.endswith("Error") and n != "DatastoreError"} <= _error_classes()
    assert issubclass(specframe.services.DatastoreError, specframe.SpecframeError)


def test_lazy_names_are_the_modules_own_objects():
    from specframe.api import load
    from specframe.decode.engine import Engine
    from specframe.registry import build_registry
    from specframe.target.kv_cache import rollback

    services = specframe.services
    assert services.Engine is Engine and services.build_registry is build_registry and services.rollback is rollback
    assert specframe.load is load


def _specframe_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every specframe import in ``path`` (name "" for ``import specframe...``), and
    ("specframe", attr) for every ``specframe.attr`` read."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "specframe":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "specframe"]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "specframe":
            found.append(("specframe", node.attr))
    return found


def _plugin_files() -> list[Path]:
    return sorted(ROOT.glob("plugins/**/*.py")) + sorted(ROOT.glob("contrib/*/*.py"))


def test_plugins_and_contrib_import_only_the_public_face():
    files = _plugin_files()
    assert len(files) > 8
    errors = _error_classes()
    seen: set[str] = set()
    beyond, moved, not_errors, unknown = {}, {}, {}, {}
    for p in files:
        key = str(p.relative_to(ROOT))
        found = _specframe_imports(p)
        seen |= {m for m, _ in found}
        beyond[key] = sorted({m for m, _ in found if m not in PUBLIC})
        moved[key] = sorted({n for m, n in found if m == "specframe" and n and n not in TOP})
        not_errors[key] = sorted({n for m, n in found if m == "specframe.errors" and n not in errors})
        unknown[key] = sorted({n for m, n in found if m == "specframe.services" and n not in specframe.services.__all__})
    assert {k: v for k, v in beyond.items() if v} == {}
    assert {k: v for k, v in moved.items() if v} == {}  # nothing of ours imports a moved name from specframe
    assert {k: v for k, v in not_errors.items() if v} == {}  # only error classes are public there
    assert {k: v for k, v in unknown.items() if v} == {}  # (a name imported inside a function fails only when called)
    assert {"specframe", "specframe.services"} <= seen


def test_importing_every_plugin_and_contrib_module_warns_nothing_of_ours():
    """In a fresh interpreter (a module already imported here would not run its imports again), with our moved-name
    warning an error: every built-in plugin module and every contrib module imports."""
    plugins = [".".join(("specframe_plugins", *p.relative_to(ROOT / "plugins").with_suffix("").parts))
               for p in sorted((ROOT / "plugins").rglob("*.py"))]
    plugins = [m.removesuffix(".__init__") for m in plugins]
    contrib = sorted(p for p in ROOT.glob("contrib/*/*.py") if p.name not in ("setup.py", "conftest.py"))
    assert len(plugins) > 8 and contrib
    code = (
        "import importlib, sys, warnings\n"
        "warnings.filterwarnings('error', message=r'specframe\\.\\w+ is moved', category=DeprecationWarning)\n"
        f"sys.path[:0] = {sorted({str(p.parent) for p in contrib})!r}\n"
        f"for m in {plugins + [p.stem for p in contrib]!r}:\n"
        "    importlib.import_module(m)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
