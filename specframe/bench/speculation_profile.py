"""Speculation profiles: a strategy's acceptance as data, in the field's shared ``speculation_profile.json`` (schema
1.0 of NVIDIA Model-Optimizer's ``examples/specdec_bench``), written by ``specframe bench`` and ``specframe replay``
and read back by ``specframe replay --profile`` and the ``synthetic`` acceptance of the bench.

Terms (per verification step, i.e. per target forward; K = the deepest draft position verified):

- acceptance length L: tokens committed by the step, the target's own (bonus or recovered) token included, so
  ``L = 1 + accepted drafts`` (vLLM's and specdec_bench's AL; TRT-LLM reports ``L - 1``).
- ``acceptance_length_histogram``: ``{L: steps}``.
- ``marginal_accept_rates[i]`` = P(the first ``i + 1`` drafts all accepted) = P(L >= i + 2), a survival function,
  so non-increasing (what vLLM's synthetic sampler reads).
- ``conditional_accept_rates[i]`` = P(draft ``i + 1`` accepted | the first ``i`` accepted) =
  ``marginal[i] / marginal[i - 1]`` (``marginal[-1] = 1``; 0 where nothing got that far).
- ``mean_accept_length`` = mean L over steps = ``1 + sum(marginal)`` (the validation's identity, within 0.02);
  ``mean_accept_length_per_request`` = the mean over requests of each request's own mean L (the two differ: a short
  request weighs as much as a long one in the second).
- ``accept_length_model``: ``chain_analytic`` where the draft at length k is a prefix of the draft at k + 1 (a lone
  chain proposer: n-gram lookup, a draft model, MTP / EAGLE chains), so one run predicts every shorter length
  (:func:`predict_accept_length`: schema 1.0's per-step truncation, and the run-level re-segmentation of the
  histogram, which is what a run at that length measures); ``measured_per_k`` for trees, merged strategies and
  block drafters, which re-plan the whole draft when k changes.

specframe adds, under ``specframe`` (other readers ignore it): the joint histogram of (verified draft nodes N,
accepted drafts A) per step (``steps_by_shape``, keys ``"N/A"``) and the mean drafting time per step, which is what
:mod:`specframe.bench.synthetic` needs to reproduce a strategy's speed on another run, and the figures of the run
(τ = new tokens / forwards, tokens/s).

L here is ``accepted + 1`` for every step, also for a request's last step where the token limit or a stop cut the
committed tokens short; τ counts what was committed, so τ <= mean L by that cut (a fraction of a token per request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import ConfigError

SCHEMA_VERSION = "1.0"
FILE = "speculation_profile.json"
CONSISTENCY_TOLERANCE = 0.02  # |AL - (1 + sum(marginal))| at most (specdec_bench's)
ACCEPT_LENGTH_MODELS = ("chain_analytic", "measured_per_k")


def _steps_histogram(records: Iterable[dict[str, Any]]) -> tuple[dict[int, int], int]:
    """``({L: steps}, K)`` of ``records`` (bench records: ``metrics.accepted_by_depth`` counts the steps whose accepted
    path reached depth i + 1, ``metrics.target_forwards`` the steps), K the deepest draft position any step verified."""
    forwards, survival, deepest = 0, [], 0
    for r in records:
        m = r["metrics"]
        forwards += int(m.get("target_forwards") or 0)
        acc = m.get("accepted_by_depth") or []
        if len(acc) > len(survival):
            survival.extend([0] * (len(acc) - len(survival)))
        for i, a in enumerate(acc):
            survival[i] += int(a)
        deepest = max(deepest, len(m.get("drafted_by_depth") or []))
    hist: dict[int, int] = {}
    reach = [forwards, *survival, 0]  # reach[j]: steps that accepted at least j drafts
    for j in range(len(reach) - 1):
        n = reach[j] - reach[j + 1]
        if n:
            hist[j + 1] = n
    return hist, max(deepest, len(survival))


def rates_from_histogram(hist: dict[int, int], k: int) -> tuple[list[float], list[float]]:
    """``(conditional, marginal)``, each ``[k]``, from ``{L: steps}``: marginal[i] = P(L >= i + 2),
    conditional[i] = marginal[i] / marginal[i - 1] (0 where the denominator is)."""
    steps = sum(hist.values())
    marginal = [sum(n for L, n in hist.items() if L >= i + 2) / steps if steps else 0.0 for i in range(k)]
    conditional, prev = [], 1.0
    for m in marginal:
        conditional.append(m / prev if prev > 0 else 0.0)
        prev = m
    return conditional, marginal


def _shapes(records: Iterable[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        for key, n in (r["metrics"].get("steps_by_shape") or {}).items():
            out[key] = out.get(key, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("/"))))


def _figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean L over steps and per request, τ and tokens/s of ``records`` (one strategy's)."""
    hist, _ = _steps_histogram(records)
    steps = sum(hist.values())
    per_request = [1 + r["metrics"]["accepted_nodes"] / r["metrics"]["target_forwards"]
                   for r in records if r["metrics"].get("target_forwards")]
    tokens = sum(r["metrics"].get("new_tokens") or 0 for r in records)
    wall = sum(r["metrics"].get("wall_s") or 0 for r in records)
    return {
        "mean_accept_length": sum(L * n for L, n in hist.items()) / steps if steps else 1.0,
        "mean_accept_length_per_request": sum(per_request) / len(per_request) if per_request else 1.0,
        "steps": steps, "requests": len(records), "tau": tokens / steps if steps else 0.0,
        "tokens_per_s": tokens / wall if wall else 0.0,
    }


def build_profile(records: list[dict[str, Any]], *, method: str, accept_length_model: str,
                  block_size: int | None = None, target_model: dict[str, Any] | None = None,
                  draft_checkpoint: dict[str, Any] | None = None,
                  measurement_conditions: dict[str, Any] | None = None, synthetic: bool = False) -> dict[str, Any]:
    """The ``speculation_profile.json`` of one strategy's bench or replay records (see the module docstring).

    Args:
        records: that strategy's records (each with ``metrics`` as :class:`~specframe.decode.metrics.RequestMetrics`
            writes them, and ``category``).
        method: the strategy, e.g. ``"ngram"`` or ``"ngram+medusa"``.
        accept_length_model: ``"chain_analytic"`` or ``"measured_per_k"``.
        block_size: a block proposer's rows per drafter forward (None: not one).
        synthetic: the acceptance was imposed (:mod:`specframe.bench.synthetic`): ``measured`` is false, as
            specdec_bench marks a profile that does not describe a drafter.

    Returns:
        The profile (JSON-ready); its ``validation`` says whether the identity and monotonicity hold.
    """
    hist, k = _steps_histogram(records)
    conditional, marginal = rates_from_histogram(hist, k)
    fig = _figures(records)
    per_category: dict[str, Any] = {}
    for cat in sorted({str(r.get("category")) for r in records if r.get("category") is not None}):
        rs = [r for r in records if str(r.get("category")) == cat]
        h, kc = _steps_histogram(rs)
        c, m = rates_from_histogram(h, kc)
        f = _figures(rs)
        per_category[cat] = {"mean_accept_length": round(f["mean_accept_length"], 6),
                             "mean_accept_length_per_request": round(f["mean_accept_length_per_request"], 6),
                             "conditional_accept_rates": [round(x, 6) for x in c],
                             "marginal_accept_rates": [round(x, 6) for x in m], "steps": f["steps"],
                             "requests": f["requests"], "tau": round(f["tau"], 6),
                             "tokens_per_s": round(f["tokens_per_s"], 3)}
    steps = fig["steps"] or 1
    propose_s = sum(r["metrics"].get("propose_s") or 0 for r in records)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "measured": not synthetic,
        "method": method,
        "draft_checkpoint": draft_checkpoint,
        "target_model": target_model,
        "num_speculative_tokens": k,
        "block_size": block_size,
        "max_supported_k": (block_size - 1) if block_size else k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(fig["mean_accept_length"], 6),
        "mean_accept_length_per_request": round(fig["mean_accept_length_per_request"], 6),
        "accept_length_model": accept_length_model,
        "accept_length_by_k": {str(k): round(fig["mean_accept_length"], 6)},
        "acceptance_length_histogram": {str(L): n for L, n in sorted(hist.items())},
        "per_category": per_category or None,
        "measurement_conditions": measurement_conditions,
        "specframe": {"steps": fig["steps"], "requests": fig["requests"], "tau": round(fig["tau"], 6),
                      "tokens_per_s": round(fig["tokens_per_s"], 3), "synthetic": synthetic,
                      "propose_ms_per_step": round(1e3 * propose_s / steps, 4), "steps_by_shape": _shapes(records)},
    }
    doc["validation"] = validation(doc["mean_accept_length"], doc["marginal_accept_rates"])
    return doc


def describe_strategy(sf: Any, strategy: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``method``, ``block_size`` and ``accept_length_model`` of a bench strategy (a dict as in the bench config):
    its proposers are built once through ``sf`` (a loaded :class:`~specframe.api.Specframe`) to read their flags.
    ``chain_analytic`` needs one proposer that is not a block proposer and drafted nothing but chains in
    ``records`` (``metrics.tree_steps`` 0); otherwise ``measured_per_k``."""
    from ..replay.driver import GREEDY, TraceVerifier

    with sf.engine(strategy["proposers"], strategy.get("merge"), strategy.get("router"), GREEDY,
                   verifier=TraceVerifier()) as engine:
        caps = engine.lineup.capabilities
        names = [p.name for p in engine.lineup.proposers]
    block = max((c.block_size for c in caps), default=0)
    chains = all(not (r["metrics"].get("tree_steps") or 0) for r in records)
    model = "chain_analytic" if len(names) == 1 and not block and chains else "measured_per_k"
    return {"method": "+".join(names), "block_size": block or None, "accept_length_model": model}


def strategy_profiles(sf_for: Any, strategies: list[dict[str, Any]], records: list[dict[str, Any]],
                      conditions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The profile of every specframe strategy that drafts (not ``none``, not peers) in ``records``: strategy name
    -> :func:`build_profile`. ``sf_for(name)`` gives the strategy's loaded Specframe; ``conditions`` go into
    ``measurement_conditions`` (the strategy's dtype / threads / engine are added from its records)."""
    out: dict[str, dict[str, Any]] = {}
    for s in strategies:
        rs = [r for r in records if r["strategy"] == s["name"] and r.get("kind") == "specframe"]
        if not rs or s.get("proposers") in (None, [{"name": "none"}]):
            continue
        shape = describe_strategy(sf_for(s["name"]), s, rs)
        cond = dict(conditions, strategy=s["name"], proposers=s["proposers"])
        if rs[0].get("settings"):
            cond["settings"] = rs[0]["settings"]
        out[s["name"]] = build_profile(rs, method=shape["method"], accept_length_model=shape["accept_length_model"],
                                       block_size=shape["block_size"], measurement_conditions=cond,
                                       target_model={"name": conditions.get("model")},
                                       synthetic=bool(rs[0].get("synthetic")))
    return out


def validation(mean_accept_length: float, marginal: Sequence[float]) -> dict[str, Any]:
    """specdec_bench's two checks: ``AL = 1 + sum(marginal)`` within :data:`CONSISTENCY_TOLERANCE`, and marginals
    non-increasing."""
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean_accept_length)
    bad = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
           for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean_accept_length, 6),
                                 "abs_delta": round(delta, 6), "tolerance": CONSISTENCY_TOLERANCE,
                                 "passed": delta <= CONSISTENCY_TOLERANCE},
            "marginal_monotonicity": {"passed": not bad, "violations": bad}}


def predict_accept_length(profile: dict[str, Any], k: int, how: str = "resegment") -> float:
    """The ``chain_analytic`` acceptance length of a decoding run at draft length ``k`` <= the profile's K.

    ``how="truncate"``: schema 1.0's formula, ``1 + sum(marginal[:k])``: what a step *at the same position* accepts
    with its draft cut to k (a chain's k-draft is a prefix of its longer one). ``how="resegment"`` (default, needs
    ``acceptance_length_histogram``): what a *run* at k averages. A run at k takes more steps through the stretches
    that one longer step crosses, so its steps sit at other positions: each step of the profile's run that committed
    L tokens is cut into ``ceil(L / (k + 1))`` steps of at most k + 1 (the rejection stays where it was, and the
    drafts of the later cut steps are the longer draft's tail: exact for a deterministic drafter of the same
    context, such as a draft model; close for lookup), so ``AL(k) = sum(L * n_L) / sum(ceil(L / (k + 1)) * n_L)``.
    Truncation underestimates a run's AL wherever acceptances come in runs (copying, boilerplate): measured on
    n-gram lookup, -7 % at k = 4 and -9 % at k = 2 from k = 8, against -1 % and 0 % re-segmented
    (docs/benchmarking.md).

    Raises:
        ConfigError: the profile is ``measured_per_k`` (each length must be measured), ``k`` is outside
            ``1 .. num_speculative_tokens``, or ``resegment`` without a histogram.
    """
    if profile.get("accept_length_model") != "chain_analytic":
        raise ConfigError(f"profile of {profile.get('method')!r}: accept_length_model is "
                          f"{profile.get('accept_length_model')!r}: its acceptance at another draft length must be "
                          "measured (bench it at that k), not extrapolated")
    marginal = profile["marginal_accept_rates"]
    if not 1 <= k <= len(marginal):
        raise ConfigError(f"profile of {profile.get('method')!r}: k = {k} is outside the measured 1 .. {len(marginal)}")
    if how == "truncate":
        return 1.0 + sum(marginal[:k])
    hist = {int(L): int(n) for L, n in (profile.get("acceptance_length_histogram") or {}).items()}
    if how != "resegment" or not hist:
        raise ConfigError(f"profile of {profile.get('method')!r}: predict with how='truncate' or 'resegment' (the "
                          "latter needs acceptance_length_histogram)")
    return sum(L * n for L, n in hist.items()) / sum(-(-L // (k + 1)) * n for L, n in hist.items())


def rates_for_length(length: float, k: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_length``: the constant conditional rate ``p`` with ``p + p^2 + ... + p^k =
    length - 1``, as ``[k]`` conditional rates (bisection to 1e-12).

    Raises:
        ConfigError: ``length`` outside ``[1, k + 1]`` or ``k < 1``.
    """
    if k < 1:
        raise ConfigError(f"synthetic acceptance: draft length k must be >= 1, got {k}")
    if not 1.0 <= length <= k + 1:
        raise ConfigError(f"synthetic acceptance: acceptance_length must be in [1, {k + 1}] for k = {k}, got {length}")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        p = (lo + hi) / 2
        if sum(p ** i for i in range(1, k + 1)) < length - 1:
            lo = p
        else:
            hi = p
    return [(lo + hi) / 2] * k


# --- reading ---------------------------------------------------------------------------------------------------------

def _number_list(doc: dict[str, Any], name: str, where: str) -> list[float]:
    v = doc.get(name)
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where}: {name} must be a list of numbers, got {json.dumps(v)[:60]}")
    bad = next((i for i, x in enumerate(v) if not 0.0 <= x <= 1.0), None)
    if bad is not None:
        raise ConfigError(f"{where}: {name}[{bad}] = {v[bad]} is not a probability in [0, 1]")
    return [float(x) for x in v]


def check_profile(doc: Any, where: str) -> dict[str, Any]:
    """Check a speculation profile (ours or another engine's) against schema 1.0 and its own identities; returns
    ``doc``.

    Raises:
        ConfigError: one line naming the field: not an object, another ``schema_version``, a missing or mistyped
            field, a probability outside [0, 1], marginals that increase, conditionals whose running product is not
            the marginals (within 1e-3), ``num_speculative_tokens`` unlike the vectors' length, an unknown
            ``accept_length_model``, or a ``mean_accept_length`` not within 0.02 of ``1 + sum(marginal)``.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a speculation profile (a JSON object with schema_version {SCHEMA_VERSION})")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{where}: schema_version is {doc.get('schema_version')!r}; this specframe reads speculation "
                          f"profiles of schema_version {SCHEMA_VERSION!r}")
    marginal = _number_list(doc, "marginal_accept_rates", where)
    conditional = _number_list(doc, "conditional_accept_rates", where)
    k = doc.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ConfigError(f"{where}: num_speculative_tokens must be a whole number >= 0, got {k!r}")
    if len(marginal) != k or len(conditional) != k:
        raise ConfigError(f"{where}: num_speculative_tokens is {k}, but marginal_accept_rates has {len(marginal)} "
                          f"entries and conditional_accept_rates {len(conditional)}: each must have one per position")
    bad = next((i for i in range(1, k) if marginal[i] > marginal[i - 1] + 1e-6), None)
    if bad is not None:
        raise ConfigError(f"{where}: marginal_accept_rates[{bad}] = {marginal[bad]} > marginal_accept_rates[{bad - 1}] "
                          f"= {marginal[bad - 1]}: a survival function cannot increase")
    running = 1.0
    for i, c in enumerate(conditional):
        running *= c
        if abs(running - marginal[i]) > 1e-3:
            raise ConfigError(f"{where}: conditional_accept_rates[{i}]: the product of conditionals 0..{i} is "
                              f"{running:.4f}, marginal_accept_rates[{i}] is {marginal[i]:.4f}: they must agree")
    if doc.get("accept_length_model") not in ACCEPT_LENGTH_MODELS:
        raise ConfigError(f"{where}: accept_length_model must be one of {', '.join(ACCEPT_LENGTH_MODELS)}, got "
                          f"{doc.get('accept_length_model')!r}")
    al = doc.get("mean_accept_length")
    if doc.get("measured", True) is not False or al is not None:
        if not isinstance(al, (int, float)) or isinstance(al, bool) or al < 1:
            raise ConfigError(f"{where}: mean_accept_length must be a number >= 1, got {al!r}")
        if abs(al - (1 + sum(marginal))) > CONSISTENCY_TOLERANCE:
            raise ConfigError(f"{where}: mean_accept_length {al} is not 1 + sum(marginal_accept_rates) = "
                              f"{1 + sum(marginal):.4f} (within {CONSISTENCY_TOLERANCE}): the vectors do not describe "
                              "the mean (truncated to too few positions?)")
    return doc


def read_profile(path: str | Path) -> dict[str, Any]:
    """Read and check ``path`` (:func:`check_profile`).

    Raises:
        ConfigError: unreadable, not JSON, or see :func:`check_profile`.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"speculation profile {path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise ConfigError(f"speculation profile {path}: not JSON ({exc})") from None
    return check_profile(doc, f"speculation profile {path}")


def write_profiles(folder: Path, profiles: dict[str, dict[str, Any]]) -> list[str]:
    """Write each strategy's profile as ``folder/profiles/<strategy>/speculation_profile.json``; returns the paths
    written, relative to ``folder``."""
    out = []
    for name, doc in profiles.items():
        rel = Path("profiles") / _safe(name) / FILE
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(json.dumps(doc, indent=1) + "\n")
        out.append(str(rel))
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.+=" else "_" for ch in name)
