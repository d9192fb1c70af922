"""Replaying proposers against a recorded trace: the engine's own step (propose -> verify -> commit -> feedback,
routing, merging, attribution, fault isolation) with the target's forward replaced by the trace.

Under greedy decoding the output does not depend on the proposer, so the target's answer to any draft is known from
its recorded continuation ``c`` (prompt + generated ids): after the token at position ``p`` the target's greedy
choice is ``c[p + 1]``. :class:`TraceScorer` gives, for each row of the verification batch (row 0 = the newest
committed token at position ``p0``, row ``i + 1`` = draft node ``i`` at depth ``d_i``, i.e. position ``p0 + d_i``),
the recorded token ``c[p0 + d_i + 1]`` and the recorded hidden states at that position; :class:`TraceVerifier` walks
the draft (a chain or a token tree) from the root taking the child equal to the row's recorded token. A node whose
path left the recording is never reached, so a draft is accepted exactly as far as its deepest path matches the
recorded continuation, and the bonus (or recovered) token is the recorded next token.

Time: a replayed forward costs nothing here, so each step reports the *modeled* time of the live forward,
``T(1) * v(N + 1)`` from the trace's cost curve (:attr:`~specframe.contracts.Scored.seconds`): routers that read the
forward's time see what they would see live, and the request's ``forward_s`` is that model. Draft time is measured.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, ContextManager, Iterator, Sequence

import torch
from torch import Tensor

from ..acceptance import greedy_tree
from ..contracts import DraftTree, TargetInfo, VerifyResult
from ..contracts.scoring import Scored
from ..errors import TraceError
from ..sampling import SamplingParams
from ..target.cost import CostCurve
from ..token_tree import node_depths
from .trace import Trace, TraceQuestion

GREEDY = SamplingParams()
NO_TOKEN = -1  # the recorded token after a position past the recording's end: no draft node equals it


class TraceVerifier:
    """Greedy verification against the recorded continuation (see the module docstring).

    ``verify``'s ``target_logits`` is here what :class:`TraceScorer` returns: ``[B, N + 1]`` int64, the recorded
    greedy token after each row (:data:`NO_TOKEN` past the recording's end).
    """

    name: ClassVar[str] = "trace"
    supports_trees: ClassVar[bool] = True

    def __init__(self) -> None:
        self.any_path_accepted = 0  # Σ over steps of the top-K oracle's accepted drafts (see any_path_depth)

    def verify(self, draft: DraftTree, target_logits: Tensor, sampling: SamplingParams,
               generator: torch.Generator) -> VerifyResult:
        rows = []
        for b in range(target_logits.shape[0]):
            want, tokens, parent = target_logits[b].tolist(), draft.token_ids[b].tolist(), draft.parent[b].tolist()
            rows.append(greedy_tree(want, tokens, parent))
            self.any_path_accepted += any_path_depth(want, tokens, parent)
        return VerifyResult(tuple(tuple(path) for path, _ in rows), tuple(tok for _, tok in rows))


def any_path_depth(want: list[int], tokens: list[int], parent: list[int]) -> int:
    """The top-K oracle of one step (speculators #1006): how deep the recorded continuation runs through the draft
    when each depth may take *any* of the draft's nodes at that depth, not only a child of the node taken above —
    what a tree built from the same per-depth candidates (a block drafter's top-K per slot) could accept at best.
    ``want`` ``[N + 1]``: the recorded token after each row (row 0 the newest token, row ``i + 1`` node ``i``).
    At least the greedy path's length; equal to it for a chain."""
    depth = node_depths(parent) if tokens else []
    by_depth: dict[int, list[int]] = {}
    for i, d in enumerate(depth):
        by_depth.setdefault(d, []).append(i)
    d, correct = 0, want[0]
    while by_depth.get(d + 1):
        hit = next((i for i in by_depth[d + 1] if tokens[i] == correct), None)
        if hit is None:
            break
        d += 1
        correct = want[hit + 1]  # the recorded token at depth d + 1 (every node at depth d is at the same position)
    return d


class TraceScorer:
    """One request's verification forwards answered from its recorded trace (see the module docstring).

    Args:
        question: the recorded request; its prompt must be the one being replayed.
        layers: feature layers the engine asks for (each must be recorded for every position).
        want_hidden: the engine asks for the last hidden state (``hidden_layer`` must be recorded).
        hidden_layer: the transformers ``hidden_states`` index of the last layer.
        cost: the trace's cost curve (the modeled seconds of each forward: :meth:`CostCurve.seconds`).

    Raises (at :meth:`prefill`): TraceError when the replayed prompt differs from the recorded one.
    """

    def __init__(self, question: TraceQuestion, layers: tuple[int, ...], want_hidden: bool, hidden_layer: int,
                 cost: CostCurve) -> None:
        self.q, self.layers, self.cost = question, layers, cost
        self.hidden_layer = hidden_layer if want_hidden else None
        tokens = question.tokens
        # next_token[p]: the target's greedy token after position p
        self.next_token = torch.tensor(tokens[1:] + [NO_TOKEN], dtype=torch.int64)
        self.length = len(question.prompt)  # committed tokens
        self.step_rows: list[int] = []

    def prefill(self, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        if ids.shape[1] != len(self.q.prompt) - 1 or ids[0].tolist() != self.q.prompt[:-1]:
            raise TraceError(f"question {self.q.question_id!r}: the replayed prompt differs from the recorded one")
        positions = list(range(ids.shape[1]))
        hidden = None if self.hidden_layer is None else self._rows(self.hidden_layer, positions[-1:])
        return hidden, self._features(positions)

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        n = draft.num_nodes
        parent = draft.parent[0].tolist()
        depths = list(range(1, n + 1)) if draft.is_chain() else node_depths(parent)
        p0 = self.length - 1
        positions = [p0] + [p0 + d for d in depths]
        end = self.next_token.shape[0]
        idx = torch.tensor([min(p, end - 1) for p in positions], dtype=torch.int64)
        tokens = self.next_token[idx][None]  # [1, N + 1]
        hidden = None if self.hidden_layer is None else self._rows(self.hidden_layer, positions)[None]
        features = self._features(positions)
        return Scored(tokens, hidden, features, None if draft.is_chain() else parent, self.cost.seconds(n + 1))

    def keep(self, accepted: list[int]) -> None:
        self.length += len(accepted) + 1  # the accepted nodes and the bonus / recovered token

    def undo(self) -> None:
        return None

    def _rows(self, layer: int, positions: list[int]) -> Tensor:
        """``[len(positions), H]``: the recorded hidden states of ``layer`` (zeros where none was recorded: rows the
        engine never keeps)."""
        start, rows = self.q.features[layer]
        idx = torch.tensor(positions, dtype=torch.int64) - start
        ok = (idx >= 0) & (idx < rows.shape[0])
        out = rows[idx.clamp(0, max(rows.shape[0] - 1, 0))]
        return out.masked_fill(~ok[:, None], 0) if not bool(ok.all()) else out

    def _features(self, positions: list[int]) -> Tensor | None:
        if not self.layers:
            return None
        return torch.stack([self._rows(layer, positions) for layer in self.layers], 1)[None]  # [1, n, F, H]


def check_needs(trace: Trace, layers: Sequence[int], want_hidden: bool, strategy: str) -> None:
    """Refuse a strategy whose proposers read hidden states the trace does not hold.

    Raises:
        TraceError: naming the layers and the fix (record with ``--features-for``).
    """
    recorded = trace.feature_layers
    hidden_layer = int(trace.manifest["target"]["num_hidden_layers"])
    missing = [layer for layer in layers if recorded.get(layer) != "all"]
    if want_hidden and hidden_layer not in recorded:
        missing.append(hidden_layer)
    if missing:
        what = "the last hidden state" if missing == [hidden_layer] and want_hidden else f"hidden states of layers {missing}"
        raise TraceError(f"strategy {strategy!r} reads {what}, which the trace at {trace.path} does not hold: record a "
                         f"trace that holds them: `specframe trace record` with --features-for NAME for each proposer of "
                         f"that strategy (e.g. --features-for medusa)")


class TraceTarget:
    """A target made from a trace's manifest, without the model: what the engine and model-free proposers (lookup,
    retrieval with its own datastore) need to know. ``tokenizer`` may be given for proposers that read text."""

    device = torch.device("cpu")

    def __init__(self, trace: Trace, tokenizer: Any = None) -> None:
        t, self.tokenizer = trace.manifest["target"], tokenizer
        self.name, self.dtype = trace.model, getattr(torch, trace.dtype)
        self.vocab_size, self.max_context = int(t["vocab_size"]), int(t["max_context"])
        self.eos_token_ids = frozenset(t["eos_token_ids"])
        self.supports_trees = bool(t["supports_trees"])
        cost = CostCurve.from_manifest(trace.manifest.get("cost"))
        self.info = TargetInfo(self.vocab_size, self.eos_token_ids, self.max_context, self.device, self.dtype,
                               self.name, tokenizer, None, self.supports_trees, cost if cost else None)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True) if self.tokenizer is not None else ""

    def forward_features(self, *args: Any, **kwargs: Any) -> Any:
        """Never called (the trace answers for the forward); its presence tells the engine that features can be had,
        so a proposer's ``feature_layers`` are checked against the trace rather than dropped."""
        raise NotImplementedError("a trace target runs no forward: replay with a TraceScorer")


def with_trace_cost(target: Any, trace: Trace) -> Any:
    """The loaded ``target`` with the trace's cost curve as ``info.cost`` (what routers read), so a replay decides as
    the recording machine's live run would; returns ``target``."""
    cost = CostCurve.from_manifest(trace.manifest.get("cost"))
    target.info = replace(target.info, cost=cost if cost else None)
    return target


@dataclass(frozen=True)
class Request:
    """One replayed request: which question, seed and repeat."""

    index: int  # into trace.questions
    seed: int = 0
    repeat: int = 0


def replay_requests(engine_for: Callable[[], ContextManager[Any]], trace: Trace, requests: Sequence[Request],
                    max_new_tokens: int, advance: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Replay ``requests`` one after another, each on an engine from ``engine_for()`` (a context manager yielding a
    :class:`~specframe.decode.engine.Engine` whose verifier is a :class:`TraceVerifier`).

    Returns one record per request, as ``specframe bench`` writes them (``token_ids``, ``finish_reason``,
    ``metrics``, ``question`` (the trace index), ``question_id``, ``category``, ``seed``, ``repeat``,
    ``prompt_tokens``), with modeled times:
    ``metrics.forward_s`` = Σ T(1)·v(N + 1) over the steps, ``wall_s`` = that + the measured draft time (no prefill, no
    framework overhead), ``replay_s`` = the replay's own seconds.

    Raises:
        TraceError: ``max_new_tokens`` beyond the recording, a strategy needing features the trace lacks, or a
            replay that left the recorded continuation (a bug: it cannot happen for a consistent trace).
    """
    if max_new_tokens > trace.max_new_tokens:
        raise TraceError(f"max_new_tokens {max_new_tokens} is more than the trace at {trace.path} holds "
                         f"({trace.max_new_tokens}): replay with max_new_tokens <= {trace.max_new_tokens}, or record "
                         f"a trace of at least {max_new_tokens} tokens")
    cost = CostCurve.from_manifest(trace.manifest.get("cost"))
    hidden_layer = int(trace.manifest["target"]["num_hidden_layers"])
    out = []
    for r in requests:
        q = trace.questions[r.index]
        with engine_for() as engine:
            factory = lambda target, layers, want_hidden, q=q: TraceScorer(q, layers, want_hidden, hidden_layer, cost)  # noqa: E731
            res = engine.generate(q.prompt, max_new_tokens=max_new_tokens, sampling=GREEDY, seed=r.seed,
                                  scorer=factory)
        if res.token_ids != q.generated[:max_new_tokens]:
            raise TraceError(f"question {q.question_id!r}: the replay left the recorded continuation; the trace "
                             f"at {trace.path} is inconsistent: record it again")
        m = res.metrics.to_dict()
        verifier = getattr(getattr(engine, "lineup", None), "verifier", None)
        if isinstance(verifier, TraceVerifier):
            m["any_path_accepted"] = verifier.any_path_accepted
        m["replay_s"] = m["wall_s"]
        m["wall_s"] = m["forward_s"] + m["propose_s"] if cost else 0.0
        m["prefill_s"] = m["verify_s"] = m["other_s"] = m["ttft_s"] = m["queue_s"] = 0.0  # (modeled: wall times are not)
        m["tokens_per_s"] = round(m["new_tokens"] / m["wall_s"], 3) if m["wall_s"] else 0.0
        out.append({"token_ids": res.token_ids, "finish_reason": res.finish_reason, "metrics": m,
                    "question": r.index, "question_id": q.question_id, "category": q.category, "seed": r.seed,
                    "repeat": r.repeat,
                    "prompt_tokens": len(q.prompt)})
        advance()
    return out


@contextlib.contextmanager
def fixed_engine(engine: Any) -> Iterator[Any]:
    """``engine_for`` for :func:`replay_requests` that hands out one ready engine (its proposer instances serve
    every request, as in serving)."""
    yield engine

