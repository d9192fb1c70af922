"""Ceilings: how fast speculation could be on this machine and workload, next to what a strategy achieved.

All three are speed-ups over plain decoding on the same cost curve ``v(n) = T(n) / T(1)`` (the machine profile's or
the bench's ``profile:``; ``v[n - 1]`` for n = 1..N tokens per forward), with drafting free:

- **oracle** (:func:`oracle`): every drafted token is accepted (the drafts are the target's own continuation), k
  drafts a step with the best k for the curve (k <= N - 1); a request of G tokens takes ``ceil(G / (k + 1))`` steps,
  its last one only as wide as it needs. Reported with its k. (vLLM's and SGLang's replay oracle.)
- **entropy bound** (:func:`entropy_bound`): Pankratov & Alistarh 2025 (arXiv 2512.11718, Thm. 1): any
  deterministic drafter verifying P nodes a step accepts in expectation at most ``(mu + mu2) ln(P) / mu^2 + O(1)``
  tokens, with ``mu`` the mean entropy of the target's distribution (nats) and ``mu2`` its mean second log-moment
  ``sum p (ln p)^2``. We take the leading term, add the bonus token, cap at P + 1, and pick the P the curve pays
  most for; the O(1) term is dropped, so it is an estimate of the bound, not a guaranteed one, and it speaks of
  sampling at temperature 1 (the moments are recorded along the greedy path of a trace).
- **top-K oracle** (:func:`any_path_speedup`, replay only): the strategy's own drafts, accepted as deep as the
  recorded continuation runs through them taking any node of each depth (not only the verified path's children):
  what a tree of the same per-depth candidates could accept (speculators #1006's top-K oracle for block drafters).

``fraction`` = measured (or, in replay, predicted) speed-up / oracle. A live bench's speed-ups count each request's
prefill, which no draft shortens, so there the oracle is also priced end to end (``speedup_end_to_end``: plain
decoding's measured prefill time plus its decode time divided by the oracle's speed-up) and the fraction is of that.
"""

from __future__ import annotations

import math
from typing import Any, Sequence


def oracle(generated: Sequence[int], v: Sequence[float]) -> dict[str, Any] | None:
    """The oracle speed-up for requests of ``generated`` tokens each on the curve ``v`` ``[N]``: ``{"speedup", "k",
    "tau"}`` (None without tokens)."""
    total = sum(generated)
    if not total or not v:
        return None
    best: dict[str, Any] | None = None
    for k in range(len(v)):
        cost = steps = 0.0
        for g in generated:
            full, rest = divmod(g, k + 1)
            cost += full * v[k] + (v[rest - 1] if rest else 0.0)
            steps += full + (1 if rest else 0)
        sp = total / cost
        if best is None or sp > best["speedup"] + 1e-12:
            best = {"speedup": sp, "k": k, "tau": total / steps}
    return best


def entropy_bound(moments: Sequence[Sequence[float]], v: Sequence[float]) -> dict[str, Any] | None:
    """The entropy bound's speed-up (see the module docstring) from per-token ``(H, M2)`` in nats: ``{"speedup",
    "p", "tau", "mu", "mu2"}``; None without moments. A target that is certain everywhere (mu = 0) bounds nothing
    below the oracle: every P gets its full P + 1 tokens."""
    if not moments or not v:
        return None
    mu = sum(m[0] for m in moments) / len(moments)
    mu2 = sum(m[1] for m in moments) / len(moments)
    best: dict[str, Any] | None = None
    for p in range(0, len(v)):
        if p == 0:
            x = 0.0
        elif mu <= 1e-9:
            x = float(p)
        else:
            x = min(float(p), (mu + mu2) * math.log(p) / (mu * mu)) if p > 1 else 0.0
        tau = 1.0 + x
        sp = tau / v[p]
        if best is None or sp > best["speedup"] + 1e-12:
            best = {"speedup": sp, "p": p, "tau": tau}
    assert best is not None
    best.update(mu=mu, mu2=mu2)
    return best


def any_path_speedup(records: Sequence[dict[str, Any]], speedup: float | None) -> dict[str, Any] | None:
    """The top-K oracle of one strategy's replay ``records`` (each with ``metrics.any_path_accepted``): its τ
    (``1 + any-path accepted drafts per step``) and its speed-up: the strategy's own ``speedup`` scaled by how many
    more tokens the same steps would commit (same drafts, same verification widths, same drafting time, so fewer
    steps by that factor). None where the records lack it."""
    if not records or any("any_path_accepted" not in r["metrics"] for r in records):
        return None
    steps = sum(r["metrics"]["target_forwards"] for r in records) or 1
    tau = 1.0 + sum(r["metrics"]["any_path_accepted"] for r in records) / steps
    own = 1.0 + sum(r["metrics"]["accepted_nodes"] for r in records) / steps
    return {"tau": tau, "speedup": speedup * tau / own if speedup is not None else None}


def ceilings(summary: dict[str, Any], records: list[dict[str, Any]], profile: dict[str, Any] | None,
             baseline: str, moments: Sequence[Sequence[float]] = ()) -> dict[str, Any] | None:
    """The ceilings of a bench or replay run, and each strategy's fraction of the oracle; None without a cost curve.

    Args:
        summary: :func:`~specframe.bench.report.aggregate`'s (``overall`` speed-ups per strategy under ``key``).
        records: the run's records (the ``baseline``'s give the tokens per request; ``any_path_accepted``, where a
            replay put it, the top-K oracle).
        profile: the cost curve as ``{"t_ms": [...], "v": [...]}``.
        moments: ``[(H, M2)]`` per generated token (a trace's), for the entropy bound (none: no bound).

    Returns:
        ``{"oracle", "entropy_bound", "strategies": {name: {"speedup", "fraction_of_oracle", "any_path"}}}``.
    """
    if not profile or not profile.get("v"):
        return None
    v = list(profile["v"])
    base = [r for r in records if r["strategy"] == baseline]
    gen = [int(r["metrics"]["new_tokens"]) for r in base] or [int(r["metrics"]["new_tokens"]) for r in records]
    orc = oracle(gen, v)
    prefill = sum(r["metrics"].get("prefill_s") or 0.0 for r in base)
    decode = sum((r["metrics"].get("wall_s") or 0.0) - (r["metrics"].get("prefill_s") or 0.0) for r in base)
    if orc and prefill > 0 and decode > 0:  # a live bench: its speed-ups count the prefill, which no draft shortens
        orc["speedup_end_to_end"] = (prefill + decode) / (prefill + decode / orc["speedup"])
    whole = (orc or {}).get("speedup_end_to_end") or (orc or {}).get("speedup")
    out: dict[str, Any] = {"oracle": orc, "entropy_bound": entropy_bound(moments, v), "strategies": {}}
    for name, entry in summary["strategies"].items():
        overall = entry["by_column"].get("overall", {})
        sp = overall.get("speedup")
        rs = [r for r in records if r["strategy"] == name]
        out["strategies"][name] = {
            "speedup": sp,
            "fraction_of_oracle": sp / whole if sp is not None and whole else None,
            "any_path": any_path_speedup(rs, sp),
        }
    return out
