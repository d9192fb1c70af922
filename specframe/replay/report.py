"""What a replay report adds to the bench report (:func:`specframe.bench.report.render_markdown`): the trace's cost
curve, how long the replay itself took, and — with ``--compare`` — the replay beside a live ``specframe bench`` of
the same strategies (τ, attribution, predicted vs measured speed-up, wall times)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..bench.config import BASELINE
from ..bench.report import OVERALL, fmt, md_table
from ..decode.metrics import current_names
from ..errors import ConfigError

ATTRIBUTION_COUNTS = ("steps", "drafted_nodes", "accepted_nodes", "accepted_alone")


def read_live(path: Path) -> dict[str, Any]:
    """A live bench's results.json, for ``--compare``.

    Raises:
        ConfigError: unreadable, not JSON, or without ``summary`` / ``records``.
    """
    try:
        doc = json.loads(Path(path).read_text())
        doc["summary"]["strategies"], doc["records"]
        for r in doc["records"]:
            r["metrics"] = current_names(r["metrics"])  # (results written before the glossary's names)
    except OSError as exc:
        raise ConfigError(f"compare with {path}: cannot read it ({exc.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"compare with {path}: not the results.json of a `specframe bench` run") from None
    return doc


def compare(summary: dict[str, Any], seconds: dict[str, float], live: dict[str, Any], path: Path) -> dict[str, Any]:
    """Per strategy in both runs: τ, per-proposer attribution counts, predicted vs measured speed-up, wall seconds
    (the replay's own time vs the live requests' summed wall time)."""
    out: dict[str, Any] = {}
    live_s = live["summary"]["strategies"]
    for name, entry in summary["strategies"].items():
        if name not in live_s:
            continue
        mine, theirs = entry["by_column"].get(OVERALL, {}), live_s[name]["by_column"].get(OVERALL, {})
        attribution = {}
        # (the `none` baseline drafts nothing; with a cost curve its lone router, timed by default, decides in which
        # steps it is asked, so its step counts follow the clock: left out, as in the report's attribution section)
        for label, a in (entry.get("attribution") or {}).items() if name != BASELINE else ():
            b = (live_s[name].get("attribution") or {}).get(label, {})
            attribution[label] = {k: [a.get(k), b.get(k)] for k in ATTRIBUTION_COUNTS}
        live_wall = sum(r["metrics"].get("wall_s") or 0 for r in live["records"] if r["strategy"] == name)
        out[name] = {
            "tau": [mine.get("tau"), theirs.get("tau")],
            "speedup": [mine.get("speedup"), theirs.get("speedup")],
            "wall_s": [seconds.get(name), live_wall],
            "attribution": attribution,
            "same_attribution": all(x == y for v in attribution.values() for x, y in v.values()),
        }
    return {"path": str(path), "strategies": out}


def forward_only_speedups(summary: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Add ``speedup_forward`` to each strategy of ``summary``: its predicted speed-up over ``none`` from the modeled
    verification forwards alone (new tokens per modeled forward second, relative to ``none``'s). It depends only on
    the committed and verified counts and the trace's cost curve — no measured time — so it ranks sweeps the same
    wherever they run. Nothing is added without a cost curve. In place."""
    totals: dict[str, list[float]] = {}
    for r in records:
        t = totals.setdefault(r["strategy"], [0.0, 0.0])
        t[0] += r["metrics"]["new_tokens"]
        t[1] += r["metrics"]["forward_s"]
    base = totals.get(BASELINE)
    if not base or not base[1]:
        return
    for name, (tokens, seconds) in totals.items():
        if seconds:
            summary["strategies"][name]["speedup_forward"] = (tokens / seconds) / (base[0] / base[1])


def profile_beside(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """What a replay report shows of a speculation profile read with ``--profile``: its source, method, AL (per step
    and per request), K, marginals, model, and for a ``chain_analytic`` one the AL it predicts at each k <= K."""
    from ..bench.speculation_profile import predict_accept_length

    k = int(doc["num_speculative_tokens"])
    chain = doc.get("accept_length_model") == "chain_analytic"
    how = "resegment" if doc.get("acceptance_length_histogram") else "truncate"
    cond = doc.get("measurement_conditions") or {}
    return {"path": str(path), "method": doc.get("method"), "measured": doc.get("measured", True),
            "mean_accept_length": doc.get("mean_accept_length"),
            "mean_accept_length_per_request": doc.get("mean_accept_length_per_request"), "num_speculative_tokens": k,
            "marginal_accept_rates": doc["marginal_accept_rates"], "accept_length_model": doc["accept_length_model"],
            "source": cond.get("source") or cond.get("engine") or cond.get("dataset"),
            "predicted_by_k": {str(j): round(predict_accept_length(doc, j, how), 4) for j in range(1, k + 1)}
            if chain else None,
            "predicted_by": how if chain else None}


def _profiles_read_lines(r: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    read = r.get("profiles_read") or []
    if not read:
        return []
    rows = [[f"`{p['path']}`", str(p["method"]), fmt(p["mean_accept_length"], "{:.3f}"),
             fmt(p["mean_accept_length_per_request"], "{:.3f}"), str(p["num_speculative_tokens"]),
             ", ".join(f"{x:.2f}" for x in p["marginal_accept_rates"][:6]), p["accept_length_model"]] for p in read]
    rows += [[f"this replay: {name}", p["method"], f"{p['mean_accept_length']:.3f}",
              f"{p['mean_accept_length_per_request']:.3f}", str(p["num_speculative_tokens"]),
              ", ".join(f"{x:.2f}" for x in p["marginal_accept_rates"][:6]), p["accept_length_model"]]
             for name, p in ours.items()]
    return ["", "## Speculation profiles read (--profile) beside this replay's", "",
            md_table(["profile", "method", "AL per step", "AL per request", "K", "marginals 1..6", "model"], rows)]


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "–"
    return f"{100 * (a - b) / b:+.2f} %"


def replay_sections(results: dict[str, Any]) -> list[str]:
    """Markdown parts: the cost curve, the replay's own time, and the comparison with a live bench."""
    r = results["replay"]
    parts: list[str] = []
    cost = r.get("cost")
    if cost:
        v = cost["v"]
        shown = [n for n in (1, 2, 4, 8, 16, 32) if n <= len(v)]
        parts += ["", "## Cost curve of the trace", "",
                  f"T(1) = {cost['t_ms'][0]:.1f} ms (mean over contexts {cost['contexts']}). v(n) = T(n)/T(1): "
                  + ", ".join(f"v({n}) = {v[n - 1]:.2f}" for n in shown) + ". Measured by the machine profile "
                  "(`specframe tune`) where the trace was recorded; the predictions hold for that machine and settings."]
    else:
        parts += ["", "## Cost curve of the trace", "", "The trace has no cost curve (recorded with --no-profile and no "
                  "machine profile): speed-ups and tokens/s cannot be predicted (shown as 0 / –); τ and α are exact."]
    parts += ["", "## Replay time", "", f"{r['run']}; {r['total_s']:.1f} s for all strategies.", "",
              md_table(["strategy", "replay s", "requests"],
                        [[name, f"{s:.2f}", str(r["requests"][name])] for name, s in r["seconds"].items()])]
    parts += _profiles_read_lines(r, results.get("speculation_profiles") or {})
    comp = r.get("compare")
    if comp:
        rows, attr_rows = [], []
        for name, c in comp["strategies"].items():
            (t_r, t_l), (s_r, s_l), (w_r, w_l) = c["tau"], c["speedup"], c["wall_s"]
            rows.append([name, fmt(t_r, "{:.4f}"), fmt(t_l, "{:.4f}"), _pct(t_r, t_l), fmt(s_r, "{:.2f}×"),
                         fmt(s_l, "{:.2f}×"), fmt(w_r, "{:.1f}"), fmt(w_l, "{:.1f}"),
                         fmt(w_l / w_r if w_r and w_l else None, "{:.0f}×"), "yes" if c["same_attribution"] else "**no**"])
            for label, counts in c["attribution"].items():
                attr_rows.append([name, label] + [f"{a} / {b}" for a, b in counts.values()])
        parts += ["", f"## Replay vs live (`{comp['path']}`)", "",
                  "τ and attribution of the replay against the live bench's, predicted against measured speed-up, and "
                  "the replay's own time against the live requests' summed wall time.", "",
                  md_table(["strategy", "τ replay", "τ live", "Δτ", "speed-up predicted", "speed-up measured",
                             "replay s", "live s", "replay faster", "same attribution"], rows)]
        if attr_rows:
            parts += ["", "Attribution counts, replay / live:", "",
                      md_table(["strategy", "proposer", *ATTRIBUTION_COUNTS], attr_rows)]
    return parts
