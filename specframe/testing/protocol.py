"""Protocol checks: the proposer keeps the contract, rolls back after partial acceptance, is deterministic under
a seed, and receives correct feedback."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..contracts import DecodeState, DraftTree, VerifyOutcome
from .report import ConformanceError, NotApplicable, ids
from .tiny import committed_features, last_hidden, single_thread, weights_checksum

if TYPE_CHECKING:
    from .calls import CallLog
    from .kit import Kit

ROLLBACK_BUDGET = 8
ROLLBACK_ROUNDS = 6  # simulated steps per prompt
ROLLBACK_PROBES = 6  # post-rollback drafts compared with a fresh instance (then stop)


def check_contract(kit: "Kit") -> None:
    """Class attributes, config model and constructor; every draft of the greedy and sampling runs follows the
    DraftTree contract and the declared capabilities; no call raises; the target's weights stay untouched."""
    _ = kit.config  # class-level checks and config validation
    rec, _ = kit.greedy_battery
    kit.fail_on_problems(rec, "greedy decoding of the kit's prompts")
    srec = kit.make()
    for seed, prompt in enumerate(kit.prompts[:2]):
        kit.generate(srec, prompt, kit.sampling, seed=seed)
    kit.fail_on_problems(srec, "sampling from the kit's prompts")
    if weights_checksum(kit.target) != kit.weights_before:
        raise ConformanceError(
            "the target model's weights changed while the proposer ran: TargetInfo.model may be read (e.g. to reuse "
            "its LM head) but never modified"
        )


def _greedy_match(tokens: list[int], parent: list[int], ref: list[int]) -> int:
    """Length of the longest root path of a draft tree (a chain included) that plain greedy decoding follows."""
    node, depth = -1, 0
    while depth < len(ref):
        nxt = next((i for i, p in enumerate(parent) if p == node and tokens[i] == ref[depth]), None)
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    return depth


def check_feedback(kit: "Kit") -> None:
    """``start`` once per request, then per step at most one ``propose`` followed by exactly one ``on_verified``
    whose outcome holds the verified draft, the number of draft nodes that match plain greedy decoding, and the
    committed tokens."""
    rec, results = kit.greedy_battery
    kit.fail_on_problems(rec, "greedy decoding of the kit's prompts")
    for r, (prompt, ref, res) in enumerate(zip(kit.prompts, kit.references, results)):
        calls = [c for c in rec.calls if c.request == r]
        if not calls or calls[0].method != "start" or sum(c.method == "start" for c in calls) != 1:
            raise ConformanceError(f"request {r}: start must be called exactly once, before anything else")
        pos, pending, steps = 0, None, 0
        for c in calls[1:]:
            where = f"request {r}, step {steps}"
            if c.method == "propose":
                if pending is not None:
                    raise ConformanceError(f"{where}: propose was called twice without on_verified in between")
                if list(c.tokens) != list(prompt) + ref[:pos]:
                    raise ConformanceError(f"{where}: propose saw tokens {ids(c.tokens)} instead of the committed ones")
                pending = c
                continue
            o = c.outcome
            verified = pending.draft.truncate(pending.budget) if pending is not None else DraftTree.empty()
            if not torch.equal(o.draft.token_ids, verified.token_ids):
                raise ConformanceError(f"{where}: on_verified got draft {ids(o.draft.token_ids[0].tolist())} but "
                                       f"{ids(verified.token_ids[0].tolist())} was verified")
            drafted = o.draft.token_ids[0].tolist()
            match = _greedy_match(drafted, o.draft.parent[0].tolist(), ref[pos:])
            expected = tuple(ref[pos: min(pos + match + 1, kit.new_tokens)])
            if o.num_accepted != match or o.committed[0] != expected:
                raise ConformanceError(
                    f"{where}: on_verified reported {o.num_accepted} accepted and committed {ids(o.committed[0])} "
                    f"for draft {ids(drafted)}, but plain greedy continues with {ids(ref[pos:pos + len(drafted) + 1])} "
                    f"({match} accepted, committing {ids(expected)})"
                )
            pos, pending, steps = pos + len(expected), None, steps + 1
            if o.finished != (pos >= kit.new_tokens):
                raise ConformanceError(f"{where}: on_verified said finished={o.finished} with {pos} tokens generated")
        if steps != res.metrics.target_forwards or pos != len(res.token_ids):
            raise ConformanceError(
                f"request {r}: on_verified was called {steps} times for {res.metrics.target_forwards} verification steps"
            )


def check_determinism(kit: "Kit") -> None:
    """Two fresh instances given the same requests and seeds draft the same tokens and generate the same output,
    whatever the global random state (torch, random) is."""
    runs = [_seeded_run(kit, global_seed) for global_seed in (1, 2)]
    for rec, _ in runs:
        kit.fail_on_problems(rec, "the determinism runs")
    (rec_a, out_a), (rec_b, out_b) = runs
    steps_a = [c for c in rec_a.calls if c.method == "propose"]
    steps_b = [c for c in rec_b.calls if c.method == "propose"]
    for a, b in zip(steps_a, steps_b):
        if not _same_draft(a.draft, b.draft):
            raise ConformanceError(
                f"two runs with the same seeds drafted differently in request {a.request} from tokens "
                f"{ids(a.tokens)}: {ids(a.draft.token_ids[0].tolist())} vs {ids(b.draft.token_ids[0].tolist())}. "
                "Draw randomness only from state.generator (never torch.rand without generator=, random or "
                "numpy.random), and derive nothing from time, object ids or set/dict iteration over such values"
            )
    if out_a != out_b or len(steps_a) != len(steps_b):
        raise ConformanceError(f"two runs with the same seeds generated different tokens: {out_a} vs {out_b}")


def _seeded_run(kit: "Kit", global_seed: int) -> tuple["CallLog", list[list[int]]]:
    device = kit.target.device
    py_state = random.getstate()
    # the global torch RNGs (the CPU's, and the target's CUDA device's where it has one) are restored afterwards
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type="cuda"):
        try:
            torch.manual_seed(global_seed)
            random.seed(global_seed)
            rec = kit.make()
            outs = [kit.generate(rec, p, kit.sampling, seed=s, max_new_tokens=16).token_ids
                    for s, p in enumerate(kit.prompts[:3])]
            return rec, outs
        finally:
            random.setstate(py_state)


def _same_draft(a: DraftTree | None, b: DraftTree | None, atol: float = 1e-5) -> bool:
    if not isinstance(a, DraftTree) or not isinstance(b, DraftTree):
        return a is b
    if not (torch.equal(a.token_ids, b.token_ids) and torch.equal(a.parent, b.parent)):
        return False
    if (a.draft_probs is None) != (b.draft_probs is None):
        return False
    return a.draft_probs is None or bool(torch.allclose(a.draft_probs, b.draft_probs, atol=atol))


def check_rollback_after_partial_acceptance(kit: "Kit") -> None:
    """After a draft is only partly accepted, the next draft equals what a fresh instance (with the same earlier
    requests behind it) drafts from the same committed tokens: nothing from the rejected tokens leaks on.

    Outcomes are simulated (some accepted nodes, then a different committed token), so the check does not depend
    on the tiny target happening to accept part of this proposer's drafts.
    """
    live, probes = _warmed(kit), 0
    for prompt in kit.prompts:
        tokens, gen = list(prompt), torch.Generator(device=kit.target.device).manual_seed(0)
        state = _state(kit, tokens, len(prompt), gen)
        _guarded(kit, live, live.start, state)
        rollback = None  # what the previous simulated outcome was, when it rejected something
        for rnd in range(ROLLBACK_ROUNDS):
            snapshot = gen.get_state()
            draft = _guarded(kit, live, live.propose, state, ROLLBACK_BUDGET)
            if rollback is not None:
                _compare_with_fresh(kit, draft, tokens, len(prompt), snapshot, rollback)
                probes += 1
                if probes >= ROLLBACK_PROBES:
                    return
            path = _first_path(draft)
            a = (5 * rnd + 1) % len(path) if path else 0  # accept a < len(path) nodes: at least one is rejected
            kept = [int(draft.token_ids[0, j]) for j in path[:a]]
            nxt = _argmax(kit, tokens + kept)
            if path and nxt == int(draft.token_ids[0, path[a]]):
                nxt = (nxt + 1) % kit.target.vocab_size
            rollback = f"{a} of {len(path)} drafted tokens accepted, then {nxt} committed" if path else None
            committed = tuple(kept + [nxt])
            _guarded(kit, live, live.on_verified, VerifyOutcome(draft, (tuple(path[:a]),), (committed,), False))
            tokens += committed
            state.tokens = torch.tensor([tokens])
            if kit.cls.needs_hidden_states:
                state.hidden = last_hidden(kit.target, tokens)
            state.features = committed_features(kit.target, tokens, state.feature_layers)
    if probes == 0:
        raise NotApplicable(f"{kit.cls.__name__} drafted nothing on the kit's prompts: no partial acceptance to test")


def _warmed(kit: "Kit") -> "CallLog":
    """A fresh instance that has served the kit's first prompt (so learning proposers have something to draft)."""
    rec = kit.make()
    kit.generate(rec, kit.prompts[0])
    kit.fail_on_problems(rec, "the warm-up request of the rollback check")
    return rec


def _feature_layers(kit: "Kit") -> tuple[int, ...]:
    if "_feature_layers" not in kit.__dict__:  # per instance (they may depend on the weights): ask one
        kit.__dict__["_feature_layers"] = kit.make().feature_layers
    return kit.__dict__["_feature_layers"]


def _state(kit: "Kit", tokens: list[int], prompt_len: int, gen: torch.Generator) -> DecodeState:
    hidden = last_hidden(kit.target, tokens) if kit.cls.needs_hidden_states else None
    layers = _feature_layers(kit)
    return DecodeState(torch.tensor([tokens]), prompt_len, kit.greedy, gen, hidden,
                       committed_features(kit.target, tokens, layers), layers)


def _guarded(kit: "Kit", rec: "CallLog", call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` (one call into ``rec``); what it raises is noted by the CallLog, then the kit fails on it."""
    with single_thread(), torch.inference_mode():
        try:
            out = call(*args)
        except Exception:  # noqa: BLE001 - logged by the CallLog
            out = None
    kit.fail_on_problems(rec, "the rollback check")
    return out


def _compare_with_fresh(kit: "Kit", draft: DraftTree, tokens: list[int], prompt_len: int, snapshot, rollback: str):
    fresh = _warmed(kit)
    gen = torch.Generator(device=kit.target.device)
    gen.set_state(snapshot)
    state = _state(kit, tokens, prompt_len, gen)
    _guarded(kit, fresh, fresh.start, state)
    expected = _guarded(kit, fresh, fresh.propose, state, ROLLBACK_BUDGET)
    n = min(draft.num_nodes, expected.num_nodes)
    same = (draft.num_nodes == 0) == (expected.num_nodes == 0) and _same_draft(
        DraftTree(draft.token_ids[:, :n], draft.parent[:, :n], None if draft.draft_probs is None else draft.draft_probs[:, :n]),
        DraftTree(expected.token_ids[:, :n], expected.parent[:, :n],
                  None if expected.draft_probs is None else expected.draft_probs[:, :n]),
        atol=1e-4,
    )
    if not same:
        raise ConformanceError(
            f"after a partial acceptance ({rollback}) the proposer drafted {ids(draft.token_ids[0].tolist())}, but a "
            f"fresh instance given the same committed tokens (and the same earlier request) drafts "
            f"{ids(expected.token_ids[0].tolist())}. State from the rejected draft tokens is leaking into new drafts: "
            "in on_verified, roll back whatever you extended per drafted token (a draft model's KV cache, an index) "
            "to the committed tokens — outcome.accepted_nodes says which drafted nodes were kept and "
            "outcome.committed which tokens were appended. If your drafts legitimately depend on feedback history "
            "(e.g. an adaptive draft length), skip this check: skip = ('rollback',)"
        )


def _first_path(draft: DraftTree) -> list[int]:
    """Node indices along the first-child path from the root (the whole draft for a chain)."""
    parent, path, at = draft.parent[0].tolist(), [], -1
    for i, p in enumerate(parent):
        if p == at:
            path.append(i)
            at = i
    return path


@torch.inference_mode()
def _argmax(kit: "Kit", tokens: list[int]) -> int:
    with single_thread():
        ids = torch.tensor([tokens], device=kit.target.device)
        return int(kit.target.model(input_ids=ids).logits[0, -1].argmax())
