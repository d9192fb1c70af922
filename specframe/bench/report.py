"""Aggregation and the human-readable report (report.md, the rich table).

Speedup of a strategy in a category = its tokens/s (total new tokens / total wall time over that category's
questions) divided by the ``none`` baseline's, measured in the same run. τ = total new tokens / total target
forwards (bonus included). Layout follows Spec-Bench: strategies as rows, categories as columns, the eight
MT-bench categories together as "multi-turn conversation".
"""

from __future__ import annotations

from typing import Any

from ..target.cost import predicted_speedup
from .config import BASELINE
from .runner import MULTI_TURN

COLUMN_ORDER = [MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag"]
OVERALL = "overall"


def _columns(records: list[dict[str, Any]]) -> list[str]:
    groups = {r["group"] for r in records}
    return [c for c in COLUMN_ORDER if c in groups] + sorted(groups - set(COLUMN_ORDER)) + [OVERALL]


def _sum(rs: list[dict[str, Any]], key: str) -> float:
    return sum((r["metrics"].get(key) or 0) for r in rs)


def aggregate(records: list[dict[str, Any]], strategies: list[str], profile: dict | None = None,
              reference: str | None = None) -> dict[str, Any]:
    """Per strategy and column: tokens/s, speedup over ``none`` (and over ``reference``, a second baseline, when
    given: ``speedup_ref``), τ, α, time split, acceptance by position."""
    cols = _columns(records)
    out: dict[str, Any] = {"columns": cols, "strategies": {}, "reference": reference}
    for s in strategies:
        per: dict[str, Any] = {}
        for col in cols:
            rs = [r for r in records if r["strategy"] == s and (col == OVERALL or r["group"] == col)]
            if not rs:
                continue
            tokens, wall = _sum(rs, "new_tokens"), _sum(rs, "wall_s")
            fwd = _sum(rs, "target_forwards")
            drafted, accepted = _sum(rs, "drafted_nodes"), _sum(rs, "accepted_nodes")
            per[col] = {
                "questions": len({(r["question"], r["seed"], r["repeat"]) for r in rs}),
                "new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
                "target_forwards": fwd, "tau": tokens / fwd if fwd else 0.0,
                "alpha": (accepted / drafted if drafted else 0.0) if rs[0]["kind"] == "specframe" else None,
            }
        rs = [r for r in records if r["strategy"] == s]
        steps = _sum(rs, "target_forwards") or 1
        split = {k: 1e3 * _sum(rs, k) / steps for k in ("propose_s", "forward_s", "verify_s", "other_s")}
        drafted_pos = _elementwise(rs, "drafted_by_depth")
        accepted_pos = _elementwise(rs, "accepted_by_depth")
        entry = {
            "by_column": per,
            "ms_per_step": split,
            "overhead_pct_of_forward": (100 * (split["verify_s"] + split["other_s"]) / split["forward_s"])
            if rs[0]["kind"] == "specframe" and split["forward_s"] else None,
            "acceptance_by_depth": [a / d if d else 0.0 for a, d in zip(accepted_pos, drafted_pos)],
            "drafted_by_depth": drafted_pos,
        }
        # the same under the names of before 0.2 (docs/how-it-works.md, "Vocabulary": renamed record keys)
        entry["acceptance_by_position"], entry["drafted_by_position"] = entry["acceptance_by_depth"], drafted_pos
        attribution = _attribution(rs, steps)
        if attribution:
            entry["attribution"] = attribution
        if any(r.get("synthetic") for r in rs):
            entry["synthetic"] = True  # imposed acceptance (specframe.bench.synthetic): labelled, never lossless
        out["strategies"][s] = entry
    for key, name in (("speedup", BASELINE), ("speedup_ref", reference)):
        if name is None:
            continue
        base = out["strategies"].get(name, {}).get("by_column", {})
        for entry in out["strategies"].values():
            for col, cell in entry["by_column"].items():
                b = base.get(col)
                cell[key] = cell["tokens_per_s"] / b["tokens_per_s"] if b and b["tokens_per_s"] else None
    spreads(out, records)
    out["by_context"] = by_context(records, strategies)
    if profile:
        t1 = profile["t_ms"][0] / 1e3
        for s, entry in out["strategies"].items():
            rs = [r for r in records if r["strategy"] == s and r["kind"] == "specframe"]
            if not rs:
                continue
            steps = _sum(rs, "target_forwards") or 1
            tau = _sum(rs, "new_tokens") / steps
            verified = 1 + _sum(rs, "drafted_nodes") / steps
            draft_s = _sum(rs, "propose_s") / steps
            entry["predicted_speedup"] = predicted_speedup(tau, verified, draft_s, t1, profile["v"])
    return out


CONTEXT_EDGES = (0, 256, 512, 1024, 2048, 4096, 8192, 1 << 30)  # prompt tokens: the bins of by_context


def by_context(records: list[dict[str, Any]], strategies: list[str]) -> dict[str, list[dict[str, Any]]] | None:
    """τ, α and speed-up by prompt length (bins :data:`CONTEXT_EDGES`; a SPEED-Bench-shaped workload's long tier puts
    1k / 2k / 8k prompts in their own bins): strategy -> ``[{"bin": "1024-2047", "context_tokens" (mean),
    "questions", "tau", "alpha", "speedup"}]``. None when every prompt falls in one bin (nothing to plot)."""
    def bin_of(n: int) -> int:
        return next(i for i in range(len(CONTEXT_EDGES) - 1) if CONTEXT_EDGES[i] <= n < CONTEXT_EDGES[i + 1])

    bins = sorted({bin_of(int(r.get("prompt_tokens") or 0)) for r in records})
    if len(bins) < 2:
        return None
    out: dict[str, list[dict[str, Any]]] = {}
    for s in strategies:
        rows = []
        for b in bins:
            rs = [r for r in records if r["strategy"] == s and bin_of(int(r.get("prompt_tokens") or 0)) == b]
            base = [r for r in records if r["strategy"] == BASELINE and bin_of(int(r.get("prompt_tokens") or 0)) == b]
            if not rs:
                continue
            fwd, tokens, wall = _sum(rs, "target_forwards"), _sum(rs, "new_tokens"), _sum(rs, "wall_s")
            drafted = _sum(rs, "drafted_nodes")
            bt, bw = _sum(base, "new_tokens"), _sum(base, "wall_s")
            hi = CONTEXT_EDGES[b + 1]
            rows.append({"bin": f"{CONTEXT_EDGES[b]}-{hi - 1}" if hi < 1 << 30 else f"{CONTEXT_EDGES[b]}+",
                         "context_tokens": sum(int(r.get("prompt_tokens") or 0) for r in rs) / len(rs),
                         "questions": len(rs), "tau": tokens / fwd if fwd else None,
                         "alpha": _sum(rs, "accepted_nodes") / drafted if drafted else None,
                         "speedup": (tokens / wall) / (bt / bw) if wall and bt and bw else None})
        out[s] = rows
    return out


def _context_lines(summary: dict[str, Any]) -> list[str]:
    ctx = summary.get("by_context")
    if not ctx:
        return []
    bins = [row["bin"] for row in next(iter(ctx.values()))]
    rows = []
    for name, cells in ctx.items():
        by = {c["bin"]: c for c in cells}
        rows.append([name] + [f"{fmt((by.get(b) or {}).get('tau'))} / {fmt((by.get(b) or {}).get('speedup'), '{:.2f}×')}"
                              for b in bins])
    return ["", "## Acceptance by context length", "",
            "τ / speed-up over `none` by prompt length in tokens (`acceptance_by_context.png`): acceptance that "
            "collapses with long context shows here.", "", md_table(["strategy"] + [f"{b} tokens" for b in bins], rows)]


# two-sided 95 % Student t quantiles by degrees of freedom (1..9); 1.96 beyond
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def spreads(out: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Each strategy's overall speed-up per pass (a pass: one seed and repeat over every question; its speed-up is its
    tokens/s over ``none``'s in the same pass) and, with two passes or more, ``speedup_spread``: ``{"n", "mean",
    "min", "max", "ci95": [lo, hi]}`` (Student t on the passes' mean), and ``within_noise_of`` the strategies whose
    interval overlaps its own (``none``: 1.0 inside the interval). In place on ``out`` (:func:`aggregate`'s)."""
    passes = sorted({(r["seed"], r["repeat"]) for r in records if "seed" in r and "repeat" in r})
    if len(passes) < 2:
        return

    def rate(name: str, p: tuple) -> float | None:
        rs = [r for r in records if r["strategy"] == name and (r["seed"], r["repeat"]) == p]
        wall = _sum(rs, "wall_s")
        return _sum(rs, "new_tokens") / wall if rs and wall else None

    for name, entry in out["strategies"].items():
        ups = []
        for p in passes:
            mine, base = rate(name, p), rate(BASELINE, p)
            if mine and base:
                ups.append(mine / base)
        if len(ups) < 2:
            continue
        n = len(ups)
        mean = sum(ups) / n
        sd = (sum((u - mean) ** 2 for u in ups) / (n - 1)) ** 0.5
        half = T95.get(n - 1, 1.96) * sd / n ** 0.5
        entry["speedup_spread"] = {"n": n, "per_pass": ups, "mean": mean, "min": min(ups), "max": max(ups),
                                   "ci95": [mean - half, mean + half]}
    for name, entry in out["strategies"].items():
        ci = (entry.get("speedup_spread") or {}).get("ci95")
        if ci is None or name == BASELINE:
            continue
        near = [BASELINE] if ci[0] <= 1.0 <= ci[1] else []
        for other, e in out["strategies"].items():
            oc = (e.get("speedup_spread") or {}).get("ci95")
            if other not in (name, BASELINE) and oc is not None and oc[0] <= ci[1] and ci[0] <= oc[1]:
                near.append(other)
        entry["within_noise_of"] = near


def _spread_lines(summary: dict[str, Any]) -> list[str]:
    rows = []
    for name, e in summary["strategies"].items():
        sp = e.get("speedup_spread")
        if sp is None or name == BASELINE:
            continue
        rows.append([name, f"{sp['mean']:.3f}×", f"{sp['ci95'][0]:.3f}–{sp['ci95'][1]:.3f}",
                     f"{sp['min']:.3f}–{sp['max']:.3f}", str(sp["n"]), ", ".join(e.get("within_noise_of") or []) or "–"])
    if not rows:
        return []
    return ["", "## Spread over passes", "",
            "Each pass (seed × repeat) runs every question with every strategy interleaved; a pass's speed-up is its "
            "tokens/s over `none`'s in that pass. 95 % interval of the mean (Student t); strategies whose intervals "
            "overlap are within noise of each other, and `none` is listed where the interval holds 1.0.", "",
            md_table(["strategy", "speed-up (mean of passes)", "95 % interval", "min–max", "passes",
                      "within noise of"], rows)]


ATTRIBUTION_SUMS = ("steps", "skipped_steps", "proposed_nodes", "drafted_nodes", "accepted_nodes", "accepted_alone",
                    "wasted_nodes", "draft_s", "faults")


def _attribution(rs: list[dict[str, Any]], steps: float) -> dict[str, dict[str, float]]:
    """Per proposer label, the strategy's attribution summed over its records, plus per-step rates.

    ``accepted_nodes`` is credited (an accepted node produced by several proposers credits each), so the
    proposers' shares can add up to more than the strategy's accepted tokens; ``accepted_alone`` does not."""
    total: dict[str, dict[str, float]] = {}
    for r in rs:
        for label, pm in (r["metrics"].get("proposers") or {}).items():
            t = total.setdefault(label, dict.fromkeys(ATTRIBUTION_SUMS, 0))
            for key in ATTRIBUTION_SUMS:
                t[key] += pm.get(key) or 0
    accepted = _sum(rs, "accepted_nodes")
    for t in total.values():
        t["acceptance_rate"] = t["accepted_nodes"] / t["drafted_nodes"] if t["drafted_nodes"] else 0.0
        asked_or_left = t["steps"] + t["skipped_steps"]  # steps with room for a draft (not the last-token ones)
        t["run_share"] = t["steps"] / asked_or_left if asked_or_left else 0.0
        t["drafted_per_step"] = t["drafted_nodes"] / steps
        t["accepted_per_step"] = t["accepted_nodes"] / steps
        t["wasted_per_step"] = t["wasted_nodes"] / steps
        t["draft_ms_per_step"] = 1e3 * t["draft_s"] / steps
        t["accepted_share"] = t["accepted_nodes"] / accepted if accepted else 0.0
    return total


def attribution_rows(entry: dict[str, Any]) -> list[list[str]]:
    """One row per proposer of a strategy's attribution (see :func:`_attribution`)."""
    return [[label, fmt(100 * a["run_share"], "{:.0f} %"), fmt(a["drafted_per_step"]), fmt(a["accepted_per_step"]),
             fmt(a["acceptance_rate"]), fmt(100 * a["accepted_share"], "{:.0f} %"), str(int(a["accepted_alone"])),
             fmt(a["wasted_per_step"]), fmt(a["draft_ms_per_step"]), str(int(a["faults"]))]
            for label, a in entry.get("attribution", {}).items()]


ATTRIBUTION_HEADER = ["proposer", "run in", "verified nodes/step", "accepted/step (credited)", "α", "share of accepted",
                      "accepted alone", "wasted nodes/step", "draft ms/step", "faults"]


def _elementwise(rs: list[dict[str, Any]], key: str) -> list[int]:
    total: list[int] = []
    for r in rs:
        for i, x in enumerate(r["metrics"].get(key) or []):
            if i >= len(total):
                total.append(0)
            total[i] += x
    return total


def fmt(x: Any, pattern: str = "{:.2f}") -> str:
    """``x`` formatted by ``pattern``, or an en dash for a missing value."""
    return "–" if x is None else pattern.format(x)


def speedup_rows(summary: dict[str, Any], key: str = "speedup") -> tuple[list[str], list[list[str]]]:
    """Header and rows of the main table: speedup per column (``key`` ``speedup_ref``: over the reference), then
    overall τ and tokens/s."""
    cols = summary["columns"]
    header = ["strategy"] + [c for c in cols] + ["τ overall", "tokens/s overall"]
    rows = []
    for s, e in summary["strategies"].items():
        cells = e["by_column"]
        row = [f"{s} (synthetic, not lossless)" if e.get("synthetic") else s]
        row += [fmt(cells.get(c, {}).get(key), "{:.2f}×") for c in cols]
        overall = cells.get(OVERALL, {})
        row += [fmt(overall.get("tau")), fmt(overall.get("tokens_per_s"), "{:.1f}")]
        rows.append(row)
    return header, rows


def speedup_table(summary: dict[str, Any], title: str, key: str = "speedup") -> Any:
    """The main table (:func:`speedup_rows`) as a rich Table whose columns fold rather than cut their text."""
    from rich.table import Table

    header, rows = speedup_rows(summary, key)
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right" if h != "strategy" else "left", overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _machine_lines(env: dict[str, Any]) -> list[str]:
    """The machine fingerprint, each strategy's dtype / threads / layout and why, and the load seen."""
    m = env.get("machine")
    if not m:
        return []
    out = [f"Machine: {m.get('cpu')}, ISA {' '.join(m.get('isa') or []) or '-'}, {m.get('cores')} usable cores."]
    settings = env.get("strategy_settings") or {}
    if settings:
        out += ["", "| strategy | dtype | threads | prepack | why |", "|---|---|---|---|---|"]
        for name, st in settings.items():
            out.append(f"| {name} | {st['dtype']} | {st['threads']} | {'on' if st['prepack'] else 'off'} | "
                       f"{st.get('dtype_reason', '')} |")
    load = env.get("load") or {}
    if load.get("others_max") is not None:
        out += ["", f"Load from other processes during the run: mean {load['others_mean']:.2f}, max "
                    f"{load['others_max']:.2f} cores."]
        if load.get("exceeded_cores"):
            out.append("**Warning: threads + other processes' load exceeded the usable cores: these timings are not "
                       "those of a quiet machine.**")
    return out


def sweep_rows(summary: dict[str, Any], strategies: list[dict[str, Any]]) -> dict[str, list[list[str]]]:
    """Per swept strategy (``grid:``), its points ranked, best first, then by τ (ties keep the config's order).

    A bench ranks by measured speed-up (to the two decimals shown). A replay ranks by the predicted speed-up of the
    verification cost alone (``speedup_forward``: τ and the verified nodes on the trace's cost curve, so the same
    wherever the replay runs) and shows the prediction with the measured draft time beside it. Returns strategy ->
    rows ``[rank, point, τ, α, speed-up(s)..., draft ms/step]``."""
    out: dict[str, list[list[str]]] = {}
    for family in dict.fromkeys(s["grid_of"] for s in strategies if s.get("grid_of")):
        points = [s for s in strategies if s.get("grid_of") == family and s["name"] in summary["strategies"]]

        def key(s: dict[str, Any]) -> tuple[float, float]:
            e = summary["strategies"][s["name"]]
            cell = e["by_column"].get(OVERALL, {})
            speed = e["speedup_forward"] if "speedup_forward" in e else round(cell.get("speedup") or 0.0, 2)
            return (-(speed or 0.0), -(cell.get("tau") or 0.0))

        rows = []
        for rank, s in enumerate(sorted(points, key=key), 1):
            e = summary["strategies"][s["name"]]
            cell = e["by_column"].get(OVERALL, {})
            speeds = [fmt(e.get("speedup_forward"), "{:.3f}×")] if "speedup_forward" in e else []
            rows.append([str(rank), ", ".join(f"{k}={v}" for k, v in s["grid_point"].items()), fmt(cell.get("tau")),
                         fmt(cell.get("alpha")), *speeds, fmt(cell.get("speedup"), "{:.2f}×"),
                         fmt(e["ms_per_step"]["propose_s"])])
        out[family] = rows
    return out


def sweep_header(summary: dict[str, Any]) -> list[str]:
    if any("speedup_forward" in e for e in summary["strategies"].values()):
        return ["rank", "settings", "τ", "α", "speed-up, verification only", "speed-up with draft time", "draft ms/step"]
    return ["rank", "settings", "τ", "α", "speed-up", "draft ms/step"]


def render_markdown(results: dict[str, Any], plots: list[str], sections: tuple[str, ...] | list[str] = ()) -> str:
    """report.md of a bench, or of a replay (``results["replay"]`` set: speed-ups and times are the cost model's
    predictions, see :mod:`specframe.replay`); ``sections`` are inserted before the plots."""
    summary, replay = results["summary"], bool(results.get("replay"))
    parts = [
        *(_replay_intro(results) if replay else _bench_intro(results)),
        *_speedup_lines(results),
        *_spread_lines(summary),
        *_context_lines(summary),
        *_category_lines(summary, replay),
        *_step_time_lines(summary, replay),
        *_cost_model_lines(results.get("profile"), summary),
        *_acceptance_lines(summary),
        *_attribution_lines(summary),
        *_profile_lines(results),
        *_surface_lines(results),
        *_ceiling_lines(results.get("ceilings"), replay),
        *sections,
    ]
    if replay:
        parts += ["", "## Replay check", "", f"Every replayed request committed exactly its recorded tokens "
                  f"({len(results['records'])} requests)."]
    else:
        parts += _lossless_lines(results, results["config"], results["lossless"])
    if plots:
        parts += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(parts) + "\n"


def _questions(results: dict[str, Any]) -> str:
    """"N question(s)": the distinct questions of the records."""
    n_q = len({r["question"] for r in results["records"]})
    return f"{n_q} question{'s' if n_q != 1 else ''}"


def _replay_intro(results: dict[str, Any]) -> list[str]:
    """Title and paragraph of a replay report: the trace replayed, and that its times are predictions."""
    cfg, env, replay = results["config"], results["environment"], results["replay"]
    t = replay["trace"]
    return [
        "# specframe replay report",
        "",
        f"Replay of the trace `{t['path']}` (model `{t['model']}`, {t['dtype']}, recorded by specframe {t['specframe']} "
        f"with {t['recorded_with']}) on {_questions(results)}, {replay['max_new_tokens']} new tokens, "
        f"seeds {cfg['seeds']}, {cfg['repeats']} repeat(s); {replay['run']}. No target forward ran: each draft was "
        "verified against the recorded greedy continuation. Times are the cost model's: a forward over n tokens "
        "costs T(1)·v(n) from the trace's cost curve, draft time is measured here, no framework overhead; speed-ups "
        "and tokens/s are **predicted**.",
        f"Environment of the replay: {env['cpu']} ({env['cpu_count']} CPUs), torch {env['torch']}, transformers "
        f"{env['transformers']}, specframe {env['specframe']}, {env['date']}.",
    ]


def _bench_intro(results: dict[str, Any]) -> list[str]:
    """Title and paragraph of a bench report: the model and run settings, the environment and the machine."""
    cfg, env = results["config"], results["environment"]
    return [
        "# specframe bench report",
        "",
        f"Model `{cfg['model']}` ({cfg['dtype']}, {cfg['device']}), temperature {cfg['temperature']}, "
        f"{cfg['max_new_tokens']} new tokens, {_questions(results)}, seeds {cfg['seeds']}, {cfg['repeats']} repeat(s); "
        f"strategies interleaved per question after {cfg['warmup']} warm-up question(s).",
        f"Environment: {env['cpu']} ({env['cpu_count']} CPUs, torch threads {env['torch_threads']}), "
        f"torch {env['torch']}, transformers {env['transformers']}, specframe {env['specframe']}, {env['date']}.",
        *_machine_lines(env),
    ]


def _speedup_lines(results: dict[str, Any]) -> list[str]:
    """The speed-up table (measured, or predicted for a replay), then one ranked table per swept strategy."""
    summary, replay = results["summary"], results.get("replay")
    title = "## Predicted speed-up over `none` and τ" if replay else "## Speedup over `none` (same run) and τ"
    parts = ["", title, "", md_table(*speedup_rows(summary))]
    if summary.get("reference"):
        parts += ["", f"## Speedup over `{summary['reference']}` (same run)", "",
                  md_table(*speedup_rows(summary, "speedup_ref"))]
    for family, rows in sweep_rows(summary, results["config"]["strategies"]).items():
        how = ("the predicted speed-up of verification alone (τ and the nodes verified, on the trace's cost curve: the "
               "same wherever the replay runs; the next column adds the draft time measured in this replay)"
               if replay else "speed-up")
        parts += ["", f"## Sweep `{family}`: {len(rows)} settings", "", f"Ranked by {how}, then τ.", "",
                  md_table(sweep_header(summary), rows)]
    return parts


def _category_lines(summary: dict[str, Any], replay: bool) -> list[str]:
    """τ and tokens/s (predicted for a replay) per strategy and question category."""
    cols = summary["columns"]
    tps_title = "## Predicted tokens/s by category" if replay else "## Tokens/s by category"
    return [
        "",
        "## τ (mean accepted length) by category",
        "",
        md_table(["strategy"] + cols, [[s] + [fmt(e["by_column"].get(c, {}).get("tau")) for c in cols]
                                        for s, e in summary["strategies"].items()]),
        "",
        tps_title,
        "",
        md_table(["strategy"] + cols, [[s] + [fmt(e["by_column"].get(c, {}).get("tokens_per_s"), "{:.1f}") for c in cols]
                                        for s, e in summary["strategies"].items()]),
    ]


def _step_time_lines(summary: dict[str, Any], replay: bool) -> list[str]:
    """Time per verification step split into propose / forward / verify+commit / other, with the framework overhead
    and α (for a replay: the measured propose time and the modeled forward)."""
    return [
        "",
        "## Time per target forward (ms) and framework overhead" if not replay else "## Time per step (ms)",
        "",
        "Per verification step: propose, target forward, verify + commit + rollback + stop checks + feedback, "
        "other (loop bookkeeping). Overhead = (verify + other) / forward. Peers: forward time only (hooks), and "
        "their first forward is the prefill (it yields the first token), so their forward column includes it."
        if not replay else "Per verification step: propose (measured in the replay) and the target forward (modeled: "
        "T(1)·v(n)); verify, commit and bookkeeping are not modeled (0).",
        "",
        md_table(["strategy", "propose", "forward", "verify+commit", "other", "overhead % of forward", "α"],
                  [[s, fmt(e["ms_per_step"]["propose_s"]), fmt(e["ms_per_step"]["forward_s"]),
                    fmt(e["ms_per_step"]["verify_s"]), fmt(e["ms_per_step"]["other_s"]),
                    fmt(e["overhead_pct_of_forward"], "{:.1f} %"),
                    fmt(e["by_column"].get(OVERALL, {}).get("alpha"))]
                   for s, e in summary["strategies"].items()]),
    ]


def _cost_model_lines(prof: dict[str, Any] | None, summary: dict[str, Any]) -> list[str]:
    """The measured cost curve v(n) and each strategy's predicted against measured speed-up (nothing without a
    profile)."""
    if not prof:
        return []
    v = prof["v"]
    shown = [n for n in (1, 2, 4, 8, 16, 32) if n <= len(v)]
    return [
        "",
        f"## Cost model (context {prof['context']}, median of {prof['repeats']})",
        "",
        f"T(1) = {prof['t_ms'][0]:.1f} ms. v(n) = T(n)/T(1): "
        + ", ".join(f"v({n}) = {v[n - 1]:.2f}" for n in shown) + ".",
        "",
        "Predicted speedup = τ / (v(n̄) + d/T(1)) with n̄ tokens verified per forward and d the proposer's time per "
        "step (zero framework overhead); measured is from the table above.",
        "",
        md_table(["strategy", "predicted", "measured"],
                  [[s, fmt(e.get("predicted_speedup"), "{:.2f}×"),
                    fmt(e["by_column"].get(OVERALL, {}).get("speedup"), "{:.2f}×")]
                   for s, e in summary["strategies"].items() if "predicted_speedup" in e]),
    ]


def _acceptance_lines(summary: dict[str, Any]) -> list[str]:
    """Acceptance rate by draft position (the first 8) of the strategies that drafted."""
    acc_rows = [[s] + [f"{a:.2f}" for a in e["acceptance_by_depth"][:8]]
                for s, e in summary["strategies"].items() if e["acceptance_by_depth"]]
    if not acc_rows:
        return []
    width = max(len(r) for r in acc_rows)
    return ["", "## Acceptance rate by draft position", "",
            md_table(["strategy"] + [f"pos {i}" for i in range(1, width)],
                      [r + [""] * (width - len(r)) for r in acc_rows])]


def _attribution_lines(summary: dict[str, Any]) -> list[str]:
    """Per-proposer attribution: one table per strategy, other than the baseline, that records it."""
    attributed = [(s, e) for s, e in summary["strategies"].items() if s != BASELINE and e.get("attribution")]
    if not attributed:
        return []
    parts = ["", "## Attribution by proposer", "",
             "Per verification step of the strategy. \"run in\": share of the steps with room for a draft (all "
             "but a request's last-token steps) in which the proposer was asked to draft (the router may leave "
             "it out). An accepted node produced by several proposers (the same token at the "
             "same place in the merged tree) is credited to each of them, so credited shares can add up to more "
             "than 100 %; \"accepted alone\" counts accepted nodes no other proposer produced. Wasted = verified "
             "nodes of that proposer that were not accepted."]
    for s, e in attributed:
        parts += ["", f"### {s}", "", md_table(ATTRIBUTION_HEADER, attribution_rows(e))]
    return parts


def speed_surface(results: dict[str, Any]) -> dict[str, Any] | None:
    """The machine's speed surface from a synthetic sweep (strategies whose ``grid_point`` sets
    ``synthetic.acceptance_length``; draft length from ``synthetic.k``): ``{"al": [...], "k": [...], "cells":
    {"AL/k": {"speedup", "tokens_per_s", "strategy"}}}``, or None when the run swept none."""
    cells: dict[str, Any] = {}
    for st in results["config"].get("strategies") or []:
        point, syn = st.get("grid_point") or {}, st.get("synthetic") or {}
        if "synthetic.acceptance_length" not in point:
            continue
        from .config import Strategy, synthetic_k

        k = synthetic_k(Strategy.model_validate({**st, "grid": None}))
        overall = results["summary"]["strategies"].get(st["name"], {}).get("by_column", {}).get(OVERALL, {})
        cells[f"{syn['acceptance_length']:g}/{k}"] = {"speedup": overall.get("speedup"),
                                                     "tokens_per_s": overall.get("tokens_per_s"), "strategy": st["name"]}
    if not cells:
        return None
    als = sorted({float(key.split("/")[0]) for key in cells})
    ks = sorted({int(key.split("/")[1]) for key in cells})
    return {"al": als, "k": ks, "cells": cells}


def _surface_lines(results: dict[str, Any]) -> list[str]:
    surf = results.get("speed_surface")
    if not surf:
        return []
    rows = [[f"{al:g}"] + [fmt((surf["cells"].get(f"{al:g}/{k}") or {}).get("speedup"), "{:.2f}×") for k in surf["k"]]
            for al in surf["al"]]
    return ["", "## Speed surface (synthetic acceptance, not lossless)", "",
            "Speed-up over `none` at each imposed acceptance length AL (rows; tokens a step, bonus included) and draft "
            "length k (columns), on this machine and settings; – : AL > k + 1 cannot be run.", "",
            md_table(["AL \\ k"] + [str(k) for k in surf["k"]], rows)]


def _profile_lines(results: dict[str, Any]) -> list[str]:
    """The speculation profiles written (one per drafting strategy): AL per step and per request, the first
    marginals, the extrapolation model and whether the schema's checks passed."""
    profiles = results.get("speculation_profiles") or {}
    if not profiles:
        return []
    rows = []
    for name, p in profiles.items():
        ok = all(v["passed"] for v in p["validation"].values())
        rows.append([name + (" (synthetic)" if not p["measured"] else ""), f"{p['mean_accept_length']:.3f}",
                     f"{p['mean_accept_length_per_request']:.3f}", str(p["num_speculative_tokens"]),
                     ", ".join(f"{x:.2f}" for x in p["marginal_accept_rates"][:6]), p["accept_length_model"],
                     "yes" if ok else "**no**"])
    return ["", "## Speculation profiles", "",
            "`profiles/<strategy>/speculation_profile.json` in specdec_bench's schema 1.0 (docs/benchmarking.md): AL = "
            "tokens per step, bonus included, over steps and as the mean of the requests' own; marginal i = P(the "
            "first i + 1 drafts accepted).", "",
            md_table(["strategy", "AL per step", "AL per request", "K", "marginals 1..6", "model", "checks pass"],
                     rows)]


def _ceiling_lines(c: dict[str, Any] | None, replay: bool) -> list[str]:
    """Oracle, entropy bound and top-K oracle (:mod:`specframe.bench.ceilings`) and each strategy's fraction."""
    if not c or not c.get("oracle"):
        return ["", "## Ceilings", "", "None: the run has no cost curve v(n) (no machine profile and no `profile:` "
                "section; a trace recorded with --no-profile), so no oracle or bound can be priced."]
    o, e = c["oracle"], c.get("entropy_bound")
    e2e = (f"; with plain decoding's measured prefill, which no draft shortens: **{o['speedup_end_to_end']:.2f}×** "
           "end to end, the figure the fractions below are of" if o.get("speedup_end_to_end") else "")
    lines = ["", "## Ceilings", "",
             f"Oracle (every draft accepted, drafting free, best k on the cost curve): {o['speedup']:.2f}× at k = "
             f"{o['k']} (τ {o['tau']:.2f}) over the decode steps{e2e}."]
    if e:
        lines.append(f"Entropy bound (arXiv 2512.11718, leading term; mean entropy {e['mu']:.3f} nats, second "
                     f"log-moment {e['mu2']:.3f}): {e['speedup']:.2f}× at P = {e['p']} (τ {e['tau']:.2f}).")
    else:
        lines.append("Entropy bound: – (needs the target's entropies: a trace recorded by this specframe, in replay).")
    rows = []
    for name, st in c["strategies"].items():
        ap = st.get("any_path")
        rows.append([name, fmt(st["speedup"], "{:.2f}×"), fmt(st["fraction_of_oracle"], "{:.0%}"),
                     fmt(ap["tau"] if ap else None), fmt(ap["speedup"] if ap else None, "{:.2f}×")])
    what = "predicted speed-up" if replay else "measured speed-up"
    lines += ["", md_table(["strategy", what, "of the oracle", "top-K oracle τ", "top-K oracle speed-up"], rows)]
    return lines


def _references(records: list[dict[str, Any]]) -> dict[str, str]:
    """strategy -> the plain-decoding strategy its greedy tokens are compared with (as in
    :func:`specframe.bench.runner.lossless_check`: ``none``, or another plain one for another engine / dtype / layout)."""
    def layout(r: dict[str, Any]) -> tuple:
        st = r.get("settings") or {}
        return st.get("engine", "transformers"), st.get("dtype"), st.get("prepack")

    plain: dict[tuple, str] = {}
    for r in sorted(records, key=lambda r: r["strategy"] != BASELINE):  # `none` first
        if r["strategy"] == BASELINE or r.get("plain"):
            plain.setdefault(layout(r), r["strategy"])
    out = {}
    for r in records:
        if r.get("synthetic"):  # imposed acceptance: never compared (specframe.bench.synthetic)
            continue
        ref = plain.get(layout(r))
        if ref is not None and r["strategy"] != ref and r["strategy"] not in plain.values():
            out[r["strategy"]] = ref
    return out


def _cause(m: dict[str, Any]) -> str:
    if m.get("near_tie"):
        return "near-tie"
    if m.get("explained"):
        return "bf16 rounding"
    if m.get("inexact_by_choice"):
        return "not bit-exact by choice (trees)"
    return "**not explained**"


def _lossless_lines(results: dict[str, Any], cfg: dict[str, Any], loss: list[dict[str, Any]] | None) -> list[str]:
    parts = ["", "## Lossless check", ""]
    if loss is None:
        parts.append("Not applicable: temperature > 0 (sampling); exactness of sampling is covered by the tests.")
    else:
        refs = _references(results["records"])
        by_ref: dict[str, list[str]] = {}
        for name, ref in sorted(refs.items()):
            by_ref.setdefault(ref, []).append(name)
        bad = sorted({m["strategy"] for m in loss})
        compared = "; ".join(f"with `{ref}` for {', '.join(names)}" for ref, names in by_ref.items()) or "(none)"
        parts.append("Greedy token ids compared with plain decoding on the same engine, dtype and weight layout: "
                     f"{compared}. " + ("All identical." if not loss else f"Mismatches in: {', '.join(bad)}."))
        synthetic = sorted({r["strategy"] for r in results["records"] if r.get("synthetic")})
        if synthetic:
            parts.append(f"Not compared: {', '.join(synthetic)} (synthetic acceptance: its tokens are not the target's, "
                         "by design).")
        if loss:
            ties = sum(1 for m in loss if m.get("near_tie"))
            explained = sum(1 for m in loss if not m.get("near_tie") and m.get("explained"))
            parts += ["", f"{len(loss)} mismatching runs; {ties} diverge at a near-tie (top-2 gap within 4 units in "
                      f"the last place of {cfg['dtype']} at that logit), {explained} more where the float32 re-score "
                      "of the shared prefix shows rounding (both tokens float32's top two, their float32 margin at "
                      "most twice the bf16 error there), "
                      f"{len(loss) - ties - explained} neither. In bf16 a 1-token and a k-token forward round "
                      "differently, so near-ties can flip; exactness is checked in float32.",
                      "", md_table(["strategy", "question", "first divergence", "top-2 logit gap", "near-tie",
                                     "fp32 margin", "bf16 error", "cause"],
                                    [[m["strategy"], str(m["question_id"]), str(m["first_divergence"]),
                                      f"{m['top2_logit_gap']:.4g}", "yes" if m.get("near_tie") else "no",
                                      fmt(m.get("fp32_gap"), "{:.4g}"), fmt(m.get("bf16_error"), "{:.4g}"),
                                      _cause(m)]
                                     for m in loss])]
    return parts
