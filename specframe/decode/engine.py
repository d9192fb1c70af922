"""The decode loop: propose -> one target forward -> verify -> commit + KV rollback -> feedback -> metrics.

The engine receives a ready target, proposer(s), a verifier and, to combine several proposers, a merge policy
and optionally a router (checked once into a :class:`~specframe.decode.lineup.Lineup`); it never names a proposer and
never calls a pluggy hook (observers arrive as a plain :class:`~specframe.decode.observe.Observers` object, or None when
no plugin observes, and then no event is built). Each request's step (:meth:`Request.step`) is six calls:

1. drafting (:mod:`specframe.decode.drafting`: routing, each proposer's draft, merging) returns the merged draft;
2. the scorer (:mod:`specframe.decode.target_scorer` for the live target; :mod:`specframe.replay` for a recorded trace) runs one forward over
   the newest committed token + the draft's nodes;
3. the verifier accepts a path and draws the recovered or bonus token;
4. the stop checks commit tokens, and the scorer keeps the accepted path's KV entries;
5. drafting gives each proposer, the merge policy and the router their feedback (attribution);
6. the metrics writer (:mod:`specframe.decode.metrics`) writes the step's metrics and observer event.

A faulty proposer is isolated (:mod:`specframe.decode.isolation`): output never depends on it.

KV invariant between steps: the cache holds every committed token except the newest one, which is fed first in
the next verification forward (so row 0 of the logits is the target's distribution for the next position and
rows 1..N score the draft nodes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from ..contracts import DecodeState, DraftTree, Proposer, TargetModel, Verifier, VerifyResult
from ..contracts.combining import MergePolicy, Router
from ..contracts.constraint import Constraint, ConstraintView
from ..contracts.optional import optional
from ..contracts.scoring import Scored, ScorerFactory
from ..errors import ConfigError, DeviceError, PromptTooLongError, first_line
from ..sampling import SamplingParams, check_logprobs
from ..target.device_sync import clock
from .drafting import Drafting
from .isolation import REFUSED, IsolationPolicy
from .lineup import Lineup, proposer_labels
from .merged_tree import MergedDraft
from .metrics import MetricsWriter, RequestMetrics
from .observe import Observers
from .options import DecodeOptions
from .stopping import StopChecker, TextStream, emitted_text, special_stop_ids
from .target_scorer import TargetScorer

__all__ = ["DecodeOptions", "Engine", "GenerationResult", "Request", "TokenLogprob", "default_scorer", "proposer_labels"]

log = logging.getLogger("specframe")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The target's log-probability of one generated token and its ``top`` alternatives: natural log of the
    softmax of the target's raw logits at that position (before a constraint's mask and before temperature / top-k
    / top-p, as vLLM's default ``raw_logprobs``), float32, taken from the verification forward's row of that
    position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


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
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when the request asked for them

    def to_dict(self) -> dict:
        d: dict[str, Any] = {}
        if self.question_id is not None:
            d["question_id"] = self.question_id
        d.update(token_ids=self.token_ids, text=self.text, finish_reason=self.finish_reason)
        d["metrics"] = self.metrics.to_dict()
        if self.machine is not None:
            d["machine"] = self.machine
        if self.logprobs is not None:
            d["logprobs"] = [{"token_id": t.token_id, "logprob": t.logprob, "top": [list(x) for x in t.top]}
                             for t in self.logprobs]
        return d


class Engine:
    """Speculative decoding over one target with a shared KV cache.

    Args:
        target: the target (:class:`~specframe.contracts.TargetModel`; :class:`specframe.target.hf.Target` for a
            transformers model).
        proposers: the active proposers, one or more; several are combined into one verification tree per step
            (see docs/combining.md). Their order is the provenance order (bit ``j`` = ``proposers[j]``).
        verifier: the acceptance rule for this request's sampling mode.
        merge: a :class:`~specframe.contracts.combining.MergePolicy`, required with two or more proposers.
        router: an optional :class:`~specframe.contracts.combining.Router`.
        isolation: how faulty proposers are treated (time limit, faults before disabling).
        origins: proposer label -> the plugin it comes from, for warnings (e.g. ``"recall (specframe-recall 0.1)"``).
        sampling: the sampling ``verifier`` was chosen for; a request that names none decodes with it (None: greedy).

    Where the verifier or the target takes chains only, tree-drafting proposers' drafts keep their leading chain.

    Raises:
        ConfigError: no proposer, the same proposer object twice, or two or more proposers without a merge policy.
    """

    def __init__(
        self,
        target: TargetModel,
        proposers: Sequence[Proposer],
        verifier: Verifier,
        *,
        merge: MergePolicy | None = None,
        router: Router | None = None,
        isolation: IsolationPolicy | None = None,
        origins: Mapping[str, str] | None = None,
        sampling: SamplingParams | None = None,
    ) -> None:
        self.target = target
        self.sampling = sampling  # what the verifier was chosen for: a request's sampling when it names none
        self.lineup = Lineup.build(proposers, verifier, merge=merge, router=router, isolation=isolation,
                                   origins=origins)
        # target hidden states at every processed position, for proposers that read features (EAGLE-style)
        layers = self.lineup.feature_layers
        self.feature_layers: tuple[int, ...] = layers if optional(target, "forward_features") is not None else ()
        if layers and not self.feature_layers:
            log.warning("target %s cannot return hidden-state features: feature-reading proposers draft nothing",
                        type(target).__name__)
        self.wants_hidden = self.lineup.needs_hidden_states  # a proposer reads DecodeState.hidden

    @property
    def proposers(self) -> list[Proposer]:
        return list(self.lineup.proposers)

    @property
    def labels(self) -> list[str]:
        return list(self.lineup.labels)

    @property
    def verifier(self) -> Verifier:
        return self.lineup.verifier

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], options: DecodeOptions | None = None, **keywords: Any) -> GenerationResult:
        """Generate after ``prompt_ids``: :meth:`request` (same arguments, same errors), run at once."""
        return self.request(prompt_ids, options, **keywords).run()

    def request(
        self,
        prompt_ids: list[int],
        options: DecodeOptions | None = None,
        *,
        max_new_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        stop_strings: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
        observer: Observers | None = None,
        between_steps: Callable[[], Any] | None = None,
        scorer: ScorerFactory | None = None,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
    ) -> "Request":
        """One request for up to ``max_new_tokens`` tokens after ``prompt_ids``, checked and ready but not started:
        :meth:`generate` runs it at once; the batch loop (:mod:`specframe.decode.batch`) steps several together.

        The request's decode options come either as one :class:`~specframe.decode.options.DecodeOptions`
        (``engine.request(ids, DecodeOptions(max_new_tokens=64, seed=7))``) or as keywords of the same meaning
        (``engine.request(ids, max_new_tokens=64, seed=7)``; ``stop_strings`` is its ``stop``), not both.
        ``sampling`` (None: the sampling this engine's verifier was chosen for, ``sf.lease(sampling=...)``; greedy
        for an engine made without one). ``seed`` seeds the request's generator. ``constraint``: the request's
        structured-output constraint, compiled for it alone (None: unconstrained); it cuts drafts, masks the
        verification logits and follows the committed tokens (see :mod:`specframe.contracts.constraint`).
        ``logprobs``: return each generated token's log-probability and this many most likely alternatives (0: the
        chosen token's only; None: none), from the verification logits (:class:`TokenLogprob`).

        The host's hooks are keywords in either form: ``observer`` receives one event per step (None: no events; see
        :meth:`Registry.observers`). ``between_steps`` is called after every step (e.g. the thread governor's cheap,
        rate-limited load check); it cannot change the output. ``scorer`` makes the request's scorer
        (:mod:`specframe.decode.target_scorer`; None: the live target with a fresh KV cache; replay passes one backed
        by a recorded trace; a batch passes its rows).

        ``max_new_tokens`` beyond the room the prompt leaves in the context is cut to that room (no buffer is sized
        by what was asked), so a huge budget means "until EOS or the context is full".

        A stop string that is one of the tokenizer's special tokens is matched by its token id (see
        :func:`~specframe.decode.stopping.special_stop_ids`).

        Raises:
            ConfigError: ``max_new_tokens < 1``, an empty prompt, or a stop string holding a special token and other
                text.
            PromptTooLongError: the prompt leaves no room in the target's context.
            TypeError: options given both ways, or neither ``options`` nor ``max_new_tokens``.
        """
        if options is None:
            if max_new_tokens is None:
                raise TypeError("Engine.request() needs max_new_tokens (or a DecodeOptions)")
            options = DecodeOptions(max_new_tokens, sampling, seed, tuple(stop_strings), constraint, logprobs, on_text)
        elif (max_new_tokens, sampling, seed, tuple(stop_strings), constraint, logprobs, on_text) != (
                None, None, 0, (), None, None, None):
            raise TypeError("Engine.request() takes a DecodeOptions or its fields as keywords, not both")
        if options.sampling is None:
            options = replace(options, sampling=self.sampling or SamplingParams())
        if options.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
        check_logprobs(options.logprobs)
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.target.max_context:
            raise PromptTooLongError(
                f"prompt has {len(prompt_ids)} tokens; the model's context is {self.target.max_context}: shorten it"
            )
        return Request(self, prompt_ids, options, observer=observer, between_steps=between_steps,
                       scorer=scorer or default_scorer(self.target))


def default_scorer(target: TargetModel) -> ScorerFactory:
    """The live scorer of ``target``: its own (``new_scorer``, e.g. llama.cpp's) or transformers' KV-cache one."""
    own = optional(target, "new_scorer")
    return (lambda t, layers, hidden: own(layers, hidden)) if own is not None else TargetScorer


_TWO_DEVICES = ("Expected all tensors to be on the same device", "Expected tensor for argument")


def _device_error(exc: Exception, nodes: int, target: TargetModel) -> DeviceError | None:
    """The named error for a verification forward that failed on its device (out of device memory, or tensors on
    two devices), or None for any other failure (a shape or mask the target refuses: a refused draft)."""
    where = getattr(target, "device", "the target's device")
    if isinstance(exc, torch.OutOfMemoryError):
        return DeviceError(
            f"the target's forward on {where} ran out of device memory verifying {1 + nodes} tokens "
            f"({first_line(exc)}): lower the draft's size (the merge policy's max_nodes, a proposer's num_nodes or "
            "draft length), run fewer requests at once, or free memory on the device")
    if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _TWO_DEVICES):
        return DeviceError(
            f"the target's forward on {where} got tensors on two devices ({first_line(exc)}): a proposer's draft "
            "is moved by the engine, so this is a tensor the target or a scorer made on another device")
    return None


class Request:
    """One request's state and loop: the public stepping API every host drives (made by :meth:`Engine.request`).

    A host that runs one request calls :meth:`run`. A host that steps requests itself (the batch loop,
    :mod:`specframe.decode.batch`; a serving loop) calls::

        req = engine.request(prompt_ids, max_new_tokens=64)
        try:
            req.start()                     # prefill, proposers' start
            while not req.finished:
                req.verify(*req.draft())    # or: draft every request, one shared forward, verify each
            result = req.result()           # GenerationResult
        finally:
            req.close()                     # the scorer's resources back (a context, a batch row)

    ``engine.request(prompt_ids, DecodeOptions(64))`` is the same request, its options as one object
    (:class:`~specframe.decode.options.DecodeOptions`, what a ``BatchRequest`` holds); the request keeps it as
    ``req.options``. :meth:`step` is ``verify(*draft())``; :meth:`draft` takes a ``cap`` on the draft's nodes (the batch's
    speculation gate). The scorer the request was made with runs the forward inside :meth:`verify`
    (:func:`default_scorer` for the live target; a batch passes one backed by its rows). A host that verifies in its
    own engine (vLLM) drives :class:`~specframe.decode.drafting.Drafting` directly instead: ``propose`` then
    ``feedback`` (see :mod:`specframe.integrations.vllm`). Not thread-safe: one thread steps a request.
    """

    def __init__(self, engine: Engine, prompt_ids: list[int], options: DecodeOptions, *,
                 observer: Observers | None = None, between_steps: Callable[[], Any] | None = None,
                 scorer: ScorerFactory | None = None) -> None:
        target = engine.target
        stop_strings, stop_ids = special_stop_ids(options.stop, target.tokenizer)
        sampling = options.sampling if options.sampling is not None else engine.sampling or SamplingParams()
        seed, on_text, constraint = options.seed, options.on_text, options.constraint
        max_new_tokens = options.max_new_tokens
        self.options = options
        self.e = engine
        self.between_steps = between_steps
        self.device = getattr(target, "device", None)  # step times wait for its queued work (device_sync)
        generator = torch.Generator(device=target.device)
        generator.manual_seed(seed)
        self.sampling = sampling
        room = target.max_context - len(prompt_ids)  # positions left in the context: generation never passes it
        max_new_tokens = min(max_new_tokens, room)  # buffers are sized by what can be generated, not what was asked
        self.buf = torch.empty((1, len(prompt_ids) + max_new_tokens), dtype=torch.int64)
        self.buf[0, : len(prompt_ids)] = torch.tensor(prompt_ids, dtype=torch.int64)
        self.length = len(prompt_ids)
        # proposers get a copy of the committed tokens: one that writes into it cannot change the output
        self.state = DecodeState(self.buf[:, : self.length].clone(), len(prompt_ids), sampling, generator)
        self.state.feature_layers = engine.feature_layers
        self.constraint = constraint  # proposers see a view that cannot advance it
        self.state.constraint = None if constraint is None else ConstraintView(constraint)
        self.top_logprobs = options.logprobs  # None: no log-probabilities kept
        self.logprobs: list[TokenLogprob] = []
        self.stops = StopChecker(  # stop strings that are special tokens end generation as an EOS does
            target.eos_token_ids | stop_ids, max_new_tokens, stop_strings, target.decode if stop_strings else None
        )
        rewrites = bool(getattr(target.tokenizer, "clean_up_tokenization_spaces", False))  # decode edits earlier text
        self.stream = TextStream(target.decode, on_text, stop_strings, rewrites) if on_text else None
        self.writer = MetricsWriter(engine.labels, len(prompt_ids), observer)
        self.seed = seed
        self.drafting = Drafting(engine.lineup, target, self.writer, sampling.is_greedy, constraint)
        self.scorer = (scorer or default_scorer(target))(target, engine.feature_layers, engine.wants_hidden)
        self.prompt_ids = prompt_ids
        self.features: torch.Tensor | None = None  # [1, buf length, F, H], filled as positions are processed

    def run(self) -> GenerationResult:
        try:
            self.start()
            while not self.finished:
                self.step()
                if self.between_steps is not None:
                    self.between_steps()
            return self.result()
        finally:
            self.close()

    @property
    def finished(self) -> bool:
        return self.stops.finish_reason is not None

    def close(self) -> None:
        """Give the scorer's resources back (an engine's context, a batch row); called once when the request ends."""
        close = optional(self.scorer, "close")
        if close is not None:
            close()

    def start(self) -> None:
        """Prefill all but the newest prompt token (the KV invariant of the module docstring) and start the proposers."""
        self.t_start = time.perf_counter()
        if self.length > 1:
            ids = self.buf[:, : self.length - 1]
            self.state.hidden, feats = self.scorer.prefill(ids)
            self._store_features(feats, 0, list(range(ids.shape[1])))
        self.writer.prefill(time.perf_counter() - self.t_start)
        self.drafting.start(self.state, self.seed)

    def result(self) -> GenerationResult:
        """The finished request's output and metrics."""
        t_start = self.t_start
        generated = self.stops.generated
        # a character the last tokens began but did not finish is left out (its bytes stay in token_ids)
        target = self.e.target
        text = emitted_text(target.decode, generated) if target.tokenizer is not None else ""
        if self.stops.stop_text_at is not None:
            text = text[: self.stops.stop_text_at]
        if self.stream:
            self.stream.update(generated, final=True, final_text=text)
        metrics = self.writer.finish(time.perf_counter() - t_start)
        return GenerationResult(list(generated), text, self.stops.finish_reason, metrics, list(self.prompt_ids),
                                logprobs=None if self.top_logprobs is None else self.logprobs[: len(generated)])

    def step(self) -> None:
        """One verification step (the six calls of the module docstring); times go to the metrics writer."""
        self.verify(*self.draft())

    def draft(self, cap: int | None = None) -> tuple[MergedDraft, float, float]:
        """Step call 1: the merged draft, with the step's start and the drafting's end (``perf_counter`` seconds).
        The batch loop drafts every request, runs one forward for all of them, then calls :meth:`verify` on each.
        ``cap``: draft nodes at most this step (0: no draft, the step commits the target's own token)."""
        t0 = time.perf_counter()
        # each step also commits one target token, so the draft may hold remaining - 1
        budget = self.stops.max_new_tokens - len(self.stops.generated) - 1
        merged = self.drafting.propose(self.state, budget if cap is None else min(cap, budget))
        return merged, t0, clock(self.device)

    @property
    def newest(self) -> torch.Tensor:
        """``[1, 1]`` int64: the newest committed token (fed first in the next verification forward)."""
        return self.buf[:, self.length - 1 : self.length]

    def verify(self, merged: MergedDraft, t0: float, t1: float) -> None:
        """Step calls 2-6 on the draft :meth:`draft` returned."""
        # 2. one target forward over [newest committed token] + the draft's nodes
        merged, scored = self._score(merged)
        t2 = clock(self.device)  # the forward's kernels have run (CUDA queues them: device_sync)
        forward_s = t2 - t1 if scored.seconds is None else scored.seconds
        raw = logits = scored.logits  # under a constraint: each row masked by the grammar state along its path
        if self.constraint is not None:
            logits = self.constraint.mask(merged.tree, logits)
            scored = replace(scored, logits=logits)
        # 3. accept: the verifier walks the draft
        result = self.e.verifier.verify(merged.tree, logits, self.sampling, self.state.generator)
        # 4. commit: stop checks per token; the KV cache, features and hidden state keep the accepted path
        accepted, committed = self._commit(merged, scored, result)
        if self.top_logprobs is not None and committed:
            self._keep_logprobs(raw, accepted, committed)
        if committed and len(self.stops.generated) == len(committed):  # this step committed the first token
            self.writer.first_token(time.perf_counter() - self.t_start)
        # 5. feedback: each proposer about its own draft, attribution, the merge policy and router
        finished = self.stops.finish_reason is not None
        report = self.drafting.feedback(merged, accepted, committed, finished, forward_s, scored.logits)
        if self.stream and committed and not finished:  # the last piece comes from run(), cut at a stop string
            self.stream.update(self.stops.generated)
        # 6. metrics: the writer counts the step and sends the observers' step event
        t3 = time.perf_counter()
        self.writer.step(report, merged.depths(), committed, finished, t1 - t0, t3 - t2)

    def _score(self, merged: MergedDraft) -> tuple[MergedDraft, Scored]:
        """Score the newest committed token + ``merged``'s draft. A draft the target's forward cannot take (a shape or
        mask it raises on) is replaced by an empty one (see :meth:`_draft_refused`); the target failing on its own
        raises."""
        newest = self.newest
        try:
            return merged, self.scorer.score(newest, merged.tree)
        except Exception as exc:
            device_error = _device_error(exc, merged.tree.num_nodes, self.e.target)
            if device_error is not None:
                raise device_error from exc  # never a refused draft: that would turn speculation off unseen
            if not merged.tree.num_nodes:
                raise  # the target fails on its own: not a draft's doing
            merged = self._draft_refused(merged, exc)
            return merged, self.scorer.score(newest, merged.tree)

    def _commit(self, merged: MergedDraft, scored: Scored, result: VerifyResult) -> tuple[list[int], list[int]]:
        """Commit the accepted path's tokens and the recovered/bonus token, through the stop checks; keep the accepted
        path's KV entries, features and hidden state. Returns ``(accepted node indices, committed tokens)``: a stop
        inside the accepted block leaves only its committed nodes accepted (for metrics, attribution, feedback and
        observers alike)."""
        draft = merged.tree
        accepted = result.accepted_nodes[0]
        committed = self.stops.feed([*draft.token_ids[0, list(accepted)].tolist(), result.next_token[0]])
        accepted = list(accepted[: len(committed)])
        self._store_features(scored.features, self.length - 1, [0, *(a + 1 for a in accepted)])
        if committed:
            if self.constraint is not None:
                self.constraint.commit(committed)
            end = self.length + len(committed)
            self.buf[0, self.length : end] = torch.tensor(committed, dtype=torch.int64)
            self.length = end
            self.state.tokens = self.buf[:, :end].clone()
        self.scorer.keep(accepted)  # a tree keeps only its accepted path
        if scored.hidden is not None:
            self.state.hidden = scored.hidden[:, accepted[-1] + 1 if accepted else 0]
        return accepted, committed

    def _keep_logprobs(self, logits: torch.Tensor, accepted: list[int], committed: list[int]) -> None:
        """Each committed token's log-probability from the row that predicted it: row 0 for the first, row
        ``a + 1`` after accepted node ``a`` for the next."""
        rows = [0, *(a + 1 for a in accepted)][: len(committed)]
        lp = torch.log_softmax(logits[0, rows].float(), dim=-1)
        chosen = lp.gather(1, torch.tensor(committed, device=lp.device)[:, None])[:, 0].tolist()
        n = min(self.top_logprobs or 0, lp.shape[-1])
        top_v, top_i = lp.topk(n, dim=-1) if n else (lp[:, :0], lp[:, :0].long())
        for j, token in enumerate(committed):
            self.logprobs.append(TokenLogprob(token, chosen[j], tuple(zip(top_i[j].tolist(), top_v[j].tolist()))))

    def _draft_refused(self, merged: MergedDraft, exc: Exception) -> MergedDraft:
        """The target's forward raised on this step's draft (a shape or mask it cannot take): restore the KV cache,
        warn, and go on without drafts of that shape — chains only after a tree, no drafts after a chain. Returns
        the empty draft the step is verified with instead (a target-only step: output unchanged)."""
        self.scorer.undo()
        was_tree = not merged.tree.is_chain()
        self.drafting.restrict(chains_only=was_tree)
        self.writer.fault(None, REFUSED)
        log.warning(
            "the target's forward raised %s on a %s draft of %d nodes from %s: %s; this step goes on without it and "
            "the rest of the request %s, output is unaffected", type(exc).__name__, "tree" if was_tree else "chain",
            merged.tree.num_nodes, "+".join(self.e.labels), first_line(exc),
            "drafts chains only" if was_tree else "decodes from the target alone")
        return MergedDraft.single(DraftTree.empty(), len(self.e.lineup.proposers))

    def _store_features(self, feats: torch.Tensor | None, start: int, rows: list[int]) -> None:
        """Keep the features of the processed rows ``rows`` (committed positions ``start, start + 1, ...``)."""
        if feats is None:
            return
        if self.features is None:
            self.features = feats.new_empty((1, self.buf.shape[1], feats.shape[2], feats.shape[3]))
        self.features[:, start : start + len(rows)] = feats[:, rows]
        self.state.features = self.features[:, : start + len(rows)]
