"""The decode loop: propose -> one target forward -> verify -> commit + KV rollback -> feedback -> stop checks.

The engine receives a ready target, proposer(s), a verifier and, to combine several proposers, a merge policy
and optionally a router; it never names a proposer and never calls a pluggy hook (observers arrive as a plain
:class:`~specframe.observe.Observers` object, or None when no plugin observes, and then no event is built).
Drafting (routing, each proposer's draft, merging, attribution, feedback) lives in :mod:`specframe.drafting`;
a faulty proposer is isolated (:mod:`specframe.isolation`). The target's forwards go through a scorer
(:mod:`specframe.scoring`): the live target by default, a recorded trace for replay (:mod:`specframe.replay`).

KV invariant between steps: the cache holds every committed token except the newest one, which is fed first in
the next verification forward (so row 0 of the logits is the target's distribution for the next position and
rows 1..N score the draft nodes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .contracts import DecodeState, DraftTree, MergePolicy, Proposer, Router, StepReport, Verifier
from .drafting import Drafting
from .errors import ConfigError, PromptTooLongError
from .isolation import REFUSED, IsolationPolicy
from .merge import MergedDraft
from .metrics import RequestMetrics
from .observe import Observers
from .sampling import SamplingParams
from .scoring import ScorerFactory, TargetScorer
from .stopping import StopChecker, TextStream, without_incomplete_character
from .tree import node_depths

log = logging.getLogger("specframe")


@dataclass
class GenerationResult:
    """What one request produced; ``to_dict()`` is the ``--json`` record."""

    token_ids: list[int]  # generated ids only (an EOS that ended generation is included)
    text: str
    finish_reason: str  # "stop" | "length"
    metrics: RequestMetrics
    prompt_token_ids: list[int] = field(default_factory=list)
    question_id: Any = None
    machine: dict[str, Any] | None = None  # how the target ran (CPU, ISA, dtype/threads and why, others' load)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        if self.question_id is not None:
            d["question_id"] = self.question_id
        d.update(token_ids=self.token_ids, text=self.text, finish_reason=self.finish_reason)
        d["metrics"] = self.metrics.to_dict()
        if self.machine is not None:
            d["machine"] = self.machine
        return d


class Engine:
    """Speculative decoding over one target with a shared KV cache.

    Args:
        target: a :class:`specframe.target.Target` (or an object with the same ``forward``/``new_cache``/
            ``decode`` and ``info``/``eos_token_ids``/``max_context``/``device`` attributes).
        proposers: the active proposers, one or more; several are combined into one verification tree per step
            (see docs/combining.md). Their order is the provenance order (bit ``j`` = ``proposers[j]``).
        verifier: the acceptance rule for this request's sampling mode.
        merge: a :class:`~specframe.contracts.MergePolicy`, required with two or more proposers.
        router: an optional :class:`~specframe.contracts.Router` (used with two or more proposers).
        isolation: how faulty proposers are treated (time budget, faults before disabling).
        origins: proposer label -> the plugin it comes from, for warnings (e.g. ``"recall (specframe-recall 0.1)"``).

    Raises:
        ConfigError: no proposer, the same proposer object twice, two or more proposers without a merge policy,
            or a proposer that drafts trees with a chain-only verifier.
    """

    def __init__(
        self,
        target: Any,
        proposers: Sequence[Proposer],
        verifier: Verifier,
        *,
        merge: MergePolicy | None = None,
        router: Router | None = None,
        isolation: IsolationPolicy | None = None,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        if not proposers:
            raise ConfigError("at least one proposer is needed (the `none` proposer decodes without drafts)")
        if len({id(p) for p in proposers}) != len(proposers):
            raise ConfigError("the same proposer object is listed twice: each combined proposer needs its own instance")
        if len(proposers) > 1 and merge is None:
            raise ConfigError(f"{len(proposers)} proposers are combined, which needs a merge policy (merge=...)")
        self.target = target
        self.proposers = list(proposers)
        self.labels = proposer_labels([p.name for p in proposers])
        self.verifier = verifier
        self.merge, self.router = merge, router
        tree_verifier = bool(getattr(verifier, "supports_trees", False))
        for p in proposers:
            if getattr(p, "produces_trees", False) and not tree_verifier:
                raise ConfigError(
                    f"proposer {p.name!r} drafts token trees but verifier {verifier.name!r} verifies chains only"
                )
        self._want_hidden = any(getattr(p, "needs_hidden_states", False) for p in proposers)
        # target hidden states at every processed position, for proposers that read features (EAGLE-style)
        layers = sorted({int(i) for p in proposers for i in (getattr(p, "feature_layers", None) or ())})
        self._layers: tuple[int, ...] = tuple(layers) if hasattr(target, "forward_features") else ()
        if layers and not self._layers:
            log.warning("target %s cannot return hidden-state features: feature-reading proposers draft nothing",
                        type(target).__name__)
        # branching drafts need a proposer that declares them, a tree-capable verifier and a target whose layers
        # all take one tree mask; otherwise a branching draft breaks the contract (that proposer's draft is left
        # out). A merged tree may branch when the verifier and target take trees; otherwise it becomes one chain.
        self.merged_trees_ok = tree_verifier and bool(getattr(target, "supports_trees", False))
        self.trees_ok = [bool(getattr(p, "produces_trees", False)) and self.merged_trees_ok for p in proposers]
        self.isolation = isolation or IsolationPolicy()
        self.origins = dict(origins or {})

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """transformers ``hidden_states`` indices the proposers read as features (``DecodeState.features``)."""
        return self._layers

    @property
    def wants_hidden(self) -> bool:
        """A proposer reads the last hidden state (``DecodeState.hidden``)."""
        return self._want_hidden

    @property
    def proposer(self) -> Proposer:
        """The first proposer (the only one unless several are combined)."""
        return self.proposers[0]

    @torch.inference_mode()
    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        seed: int = 0,
        stop_strings: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
        observer: Observers | None = None,
        between_steps: Callable[[], Any] | None = None,
        scorer: ScorerFactory | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt_ids``.

        ``observer`` receives one event per step (None: no events; see :meth:`Registry.observers`).
        ``between_steps`` is called after every step (e.g. the thread governor's cheap, rate-limited load check); it
        cannot change the output. ``scorer`` makes the request's scorer (:mod:`specframe.scoring`; None: the live
        target with a fresh KV cache; replay passes one backed by a recorded trace).

        Raises:
            ConfigError: ``max_new_tokens < 1`` or an empty prompt.
            PromptTooLongError: the prompt leaves no room in the target's context.
        """
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.target.max_context:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.target.max_context}: shorten it"
            )
        return _Request(self, prompt_ids, max_new_tokens, sampling, seed, tuple(stop_strings), on_text, observer,
                        between_steps, scorer or TargetScorer).run()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def proposer_labels(names: Sequence[str]) -> list[str]:
    """Unique labels for proposers: the name, then ``name#2``, ``name#3`` for repeats of a name."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


class _Request:
    """One request's state and loop (kept apart from ``Engine`` so the engine stays reusable)."""

    def __init__(self, engine, prompt_ids, max_new_tokens, sampling, seed, stop_strings, on_text, observer,
                 between_steps, scorer) -> None:
        self.e = engine
        self.between_steps = between_steps
        target = engine.target
        self.device = target.device
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        self.sampling = sampling
        self.buf = torch.empty((1, len(prompt_ids) + max_new_tokens), dtype=torch.int64)
        self.buf[0, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.int64)
        self.length = len(prompt_ids)
        # proposers get a copy of the committed tokens: one that writes into it cannot change the output
        self.state = DecodeState(self.buf[:, : self.length].clone(), len(prompt_ids), sampling, generator)
        self.room = target.max_context - len(prompt_ids)  # positions left in the context
        self.stops = StopChecker(
            target.eos_token_ids, min(max_new_tokens, self.room), stop_strings, target.decode if stop_strings else None
        )
        self.stream = (
            TextStream(target.decode, on_text, max((len(s) for s in stop_strings), default=1) - 1) if on_text else None
        )
        self.metrics = RequestMetrics(prompt_tokens=len(prompt_ids))
        self.seed = seed
        self.drafting = Drafting(
            engine.proposers, engine.labels, engine.origins, engine.trees_ok, engine.merged_trees_ok, engine.merge,
            engine.router, engine.isolation, self.metrics, target.vocab_size, sampling.is_greedy,
        )
        self.observer = observer
        self._faults_seen = 0  # proposer faults already reported to the observer
        self.scorer = scorer(target, engine._layers, engine._want_hidden)
        self.prompt_ids = prompt_ids
        self.features: torch.Tensor | None = None  # [1, prompt + max_new, F, H], filled as positions are processed
        self.state.feature_layers = engine._layers

    def run(self) -> GenerationResult:
        t_start = time.perf_counter()
        e, m = self.e, self.metrics
        if self.length > 1:  # prefill all but the newest token (see the KV invariant above)
            ids = self.buf[:, : self.length - 1]
            self.state.hidden, feats = self.scorer.prefill(ids)
            self._store_features(feats, 0, list(range(ids.shape[1])))
        m.prefill_s = time.perf_counter() - t_start
        self.drafting.start(self.state, self.seed)
        while self.stops.finish_reason is None:
            self.step()
            if self.between_steps is not None:
                self.between_steps()
        m.wall_s = time.perf_counter() - t_start
        generated = self.stops.generated
        # a character the last tokens began but did not finish is left out (its bytes stay in token_ids)
        text = without_incomplete_character(e.target.decode(generated)) if e.target.tokenizer is not None else ""
        if self.stops.stop_text_at is not None:
            text = text[: self.stops.stop_text_at]
        if self.stream:
            self.stream.update(generated, final=True, final_text=text)
        m.new_tokens = len(generated)
        return GenerationResult(list(generated), text, self.stops.finish_reason, m, list(self.prompt_ids))

    def step(self) -> None:
        e, m, state = self.e, self.metrics, self.state
        remaining = self.stops.max_new_tokens - len(self.stops.generated)
        # 1. propose: each proposer drafts, the drafts merge into one tree (each step also commits one
        # recovered or bonus token, so the drafts may hold remaining - 1 tokens)
        t0 = time.perf_counter()
        merged = self.drafting.propose(state, remaining - 1)
        # 2-3. one target forward over [newest committed token] + draft nodes
        t1 = time.perf_counter()
        newest = self.buf[:, self.length - 1 : self.length]
        try:
            scored = self.scorer.score(newest, merged.tree)
        except Exception as exc:  # noqa: BLE001 - a draft the target cannot take must not end the request
            if not merged.tree.num_nodes:
                raise  # the target fails on its own: not a draft's doing
            merged = self._draft_refused(merged, exc)
            scored = self.scorer.score(newest, merged.tree)
        draft, parent = merged.tree, scored.parent
        n, tree = draft.num_nodes, parent is not None
        # 4. accept
        t2 = time.perf_counter()
        forward_s = t2 - t1 if scored.seconds is None else scored.seconds
        result = e.verifier.verify(draft, scored.logits, self.sampling, state.generator)
        accepted = result.accepted_nodes[0]
        # 5. commit, stop checks per token, KV rollback to the committed length minus the newest token
        committed = self.stops.feed([*draft.token_ids[0, list(accepted)].tolist(), result.next_token[0]])
        # a stop inside the accepted block: only its committed nodes count as accepted, everywhere below (metrics,
        # attribution, feedback, observers); the committed tokens are the accepted path's first ones
        accepted = accepted[: len(committed)]
        self._store_features(scored.features, self.length - 1, [0, *(a + 1 for a in accepted)])
        self._commit(committed)
        self.scorer.keep(list(accepted))  # a tree keeps only its accepted path
        if scored.hidden is not None:
            state.hidden = scored.hidden[:, accepted[-1] + 1 if accepted else 0]
        m.record_step(n, len(accepted), node_depths(parent) if tree else None)
        # 6. feedback: each proposer about its own draft, attribution, the policy and router
        finished = self.stops.finish_reason is not None
        report = self.drafting.feedback(merged, accepted, committed, finished, forward_s)
        if self.stream and committed and not finished:  # the last piece comes from run(), cut at a stop string
            self.stream.update(self.stops.generated)
        if self.observer is not None:
            self._observe(n, len(accepted), committed, finished, report)
        t3 = time.perf_counter()
        m.propose_s += t1 - t0
        m.forward_s += forward_s
        m.verify_s += t3 - t2

    def _draft_refused(self, merged: MergedDraft, exc: Exception) -> MergedDraft:
        """The target's forward raised on this step's draft (a shape or mask it cannot take): restore the KV cache,
        warn, and go on without drafts of that shape — chains only after a tree, no drafts after a chain. Returns
        the empty draft the step is verified with instead (a target-only step: output unchanged)."""
        self.scorer.undo()
        was_tree = not merged.tree.is_chain()
        self.drafting.restrict(chains_only=was_tree)
        m = self.metrics
        m.proposer_faults += 1
        m.proposer_fault_kinds[REFUSED] = m.proposer_fault_kinds.get(REFUSED, 0) + 1
        log.warning(
            "the target's forward raised %s on a %s draft of %d nodes from %s: %s; this step goes on without it and "
            "the rest of the request %s, output is unaffected", type(exc).__name__, "tree" if was_tree else "chain",
            merged.tree.num_nodes, "+".join(self.e.labels), _first_line(exc),
            "drafts chains only" if was_tree else "decodes from the target alone")
        return MergedDraft.single(DraftTree.empty(), len(self.e.proposers))

    def _store_features(self, feats: torch.Tensor | None, start: int, rows: list[int]) -> None:
        """Keep the features of the processed rows ``rows`` (committed positions ``start, start + 1, ...``)."""
        if feats is None:
            return
        if self.features is None:
            self.features = feats.new_empty((1, self.buf.shape[1], feats.shape[2], feats.shape[3]))
        self.features[:, start : start + len(rows)] = feats[:, rows]
        self.state.features = self.features[:, : start + len(rows)]

    def _commit(self, tokens: list[int]) -> None:
        if tokens:
            end = self.length + len(tokens)
            self.buf[0, self.length : end] = torch.tensor(tokens, dtype=torch.int64)
            self.length = end
            self.state.tokens = self.buf[:, :end].clone()

    def _observe(self, drafted: int, accepted: int, committed: list[int], finished: bool, report: StepReport) -> None:
        m = self.metrics
        faults, self._faults_seen = m.proposer_faults - self._faults_seen, m.proposer_faults
        self.observer.step(
            m.target_forwards - 1, "+".join(self.e.labels), drafted, accepted, tuple(committed), faults, finished,
            report.proposers,
        )
