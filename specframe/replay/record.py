"""Recording traces: the target runs once per question (greedy, through the ordinary engine with any exact
strategy), and a recording scorer keeps what feature-based proposers would read from the verification forwards.

What to keep is asked of the proposers themselves: each one named by ``features_for`` is built and its declared
needs read from the engine (``feature_layers``: those layers at every processed position; ``needs_hidden_states``:
the last layer from the prompt's last-but-one position on). The recording scorer asks the target for those layers
as well as what the recording strategy itself reads, and keeps, like the engine does for ``DecodeState.features``,
the rows of every position that ends up committed (the prefill's, then each step's newest token and accepted
nodes).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .. import __version__
from ..contracts import DraftTree
from ..contracts.optional import optional
from ..contracts.scoring import Scored
from ..decode.target_scorer import TargetScorer
from ..io.prompts import Prompt
from .driver import GREEDY
from .trace import FORMAT, VERSION, Trace, TraceQuestion


class RecordingScorer(TargetScorer):
    """The live scorer, also keeping the hidden states of ``tap`` layers at every committed position and the target's
    entropy moments at every generated token.

    ``rows`` collects ``[n, F_tap, H]`` blocks in position order (positions 0, 1, ... of the request); ``moments``
    ``[(H, M2)]``, one per committed token in order: the entropy ``H = -sum p log p`` (nats) and the second log-moment
    ``M2 = sum p (log p)^2`` of the target's distribution (temperature 1) that predicted it.
    """

    def __init__(self, target: Any, layers: tuple[int, ...], want_hidden: bool, tap: tuple[int, ...]) -> None:
        every = tuple(sorted(set(layers) | set(tap)))
        super().__init__(target, every, want_hidden)
        self.own = [every.index(layer) for layer in layers]  # what the engine asked for
        self.tap = [every.index(layer) for layer in tap]
        self.rows: list[Tensor] = []
        self.moments: list[tuple[float, float]] = []
        self.last: Tensor | None = None
        self.last_logits: Tensor | None = None

    def prefill(self, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        hidden, feats = super().prefill(ids)
        if self.tap:
            self.rows.append(feats[0][:, self.tap].cpu())
        return hidden, self._own(feats)

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        s = super().score(newest, draft)
        self.last, self.last_logits = s.features, s.logits
        return Scored(s.logits, s.hidden, self._own(s.features), s.parent, s.seconds)

    def keep(self, accepted: list[int]) -> None:
        super().keep(accepted)
        rows = [0, *(a + 1 for a in accepted)]  # the rows that predicted the committed tokens
        if self.tap:
            self.rows.append(self.last[0, rows][:, self.tap].cpu())
        self.moments.extend(entropy_moments(self.last_logits[0, rows]))

    def _own(self, feats: Tensor | None) -> Tensor | None:
        return feats[:, :, self.own] if self.own and feats is not None else None


def entropy_moments(logits: Tensor) -> list[tuple[float, float]]:
    """``[(H, M2)]`` per row of ``logits`` ``[n, V]``: entropy ``-sum p log p`` and ``sum p (log p)^2``, in nats, of
    ``softmax(logits)`` in float32 (the moments the entropy bound of :mod:`specframe.bench.ceilings` reads)."""
    logp = torch.log_softmax(logits.float(), -1)
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    h = -plogp.sum(-1)
    m2 = (torch.where(p > 0, plogp * logp, torch.zeros_like(p))).sum(-1)
    return [(round(float(a), 5), round(float(b), 5)) for a, b in zip(h, m2)]


def declared_needs(sf: Any, proposers: Sequence[str | dict[str, Any]]) -> dict[int, str]:
    """Layers to record for ``proposers`` (names or proposer configs, each built through ``sf`` as a request would
    build it): layer ->
    ``"all"`` (read as ``feature_layers``: every position) or ``"last"`` (the last layer, read as
    ``DecodeState.hidden``: from the prompt's last-but-one position on)."""
    out: dict[int, str] = {}
    last = int(sf.target.model.config.get_text_config().num_hidden_layers)
    for entry in proposers:
        with sf.engine(proposers=[entry]) as engine:
            for layer in engine.feature_layers:
                out[layer] = "all"
            if engine.wants_hidden:
                out.setdefault(last, "last")
    return dict(sorted(out.items()))


def record_trace(sf: Any, prompts: Sequence[Prompt], *, max_new_tokens: int, chat: bool = True,
                 proposers: Sequence[dict[str, Any]] = ({"name": "none"},),
                 features_for: Sequence[str | dict[str, Any]] = (),
                 advance: Callable[[], None] = lambda: None) -> Trace:
    """Run the target once per prompt and return the trace (not yet written: :func:`~.trace.write_trace`).

    Args:
        sf: a loaded :class:`~specframe.api.Specframe` (its target is recorded).
        prompts: the questions, in order.
        max_new_tokens: tokens generated per question at most.
        chat: apply the chat template (as ``specframe bench`` does by default).
        proposers: the strategy that runs the target (any exact one; greedy output does not depend on it).
        features_for: proposers (names or configs) whose declared hidden-state needs are recorded (see the module
            docstring).

    Raises:
        ConfigError / UnknownProposerError: a bad recording strategy or ``features_for`` name.
    """
    layers = declared_needs(sf, features_for)
    questions: list[TraceQuestion] = []
    for p in prompts:
        questions.append(_record_question(sf, p, max_new_tokens, chat, proposers, layers))
        advance()
    return Trace(_manifest(sf, questions, max_new_tokens, chat, proposers, features_for, layers), questions)


def _record_question(sf: Any, p: Prompt, max_new_tokens: int, chat: bool, proposers: Sequence[dict[str, Any]],
                     layers: dict[int, str]) -> TraceQuestion:
    """Generate greedily for one prompt with the recording strategy; with ``layers`` to record, a recording scorer
    keeps their hidden states at every committed position (from the prompt's last-but-one position on for a
    ``"last"`` layer)."""
    tap = tuple(layers)
    ids = sf.encode(p.text, chat)
    scorers: list[RecordingScorer] = []

    def factory(t: Any, own: tuple[int, ...], want_hidden: bool) -> TargetScorer:
        scorers.append(RecordingScorer(t, own, want_hidden, tap))
        return scorers[-1]

    with sf.engine(proposers=list(proposers), sampling=GREEDY) as engine, torch.inference_mode():
        res = engine.generate(ids, max_new_tokens=max_new_tokens, sampling=GREEDY, scorer=factory)
    q = TraceQuestion(p.question_id, p.category, list(ids), list(res.token_ids), res.finish_reason)
    q.entropy = [list(m) for m in scorers[0].moments[: len(q.generated)]]  # (the last step may commit fewer)
    if tap:
        rows = torch.cat(scorers[0].rows, 0)  # [T - 1, F, H]: positions 0 .. T - 2
        for f, (layer, kind) in enumerate(layers.items()):
            start = 0 if kind == "all" else max(0, len(ids) - 2)
            q.features[layer] = (start, rows[start:, f].contiguous())
    return q


def _manifest(sf: Any, questions: list[TraceQuestion], max_new_tokens: int, chat: bool,
              proposers: Sequence[dict[str, Any]], features_for: Sequence[str | dict[str, Any]],
              layers: dict[int, str]) -> dict[str, Any]:
    """The trace's manifest: format and versions, the model and the settings it was recorded with, what a replay
    needs of the target (vocabulary, context, shapes, its cost curve when profiled), the recorded feature layers
    and one summary line per question."""
    target = sf.target
    info = target.info
    text = target.model.config.get_text_config()
    cost = info.cost
    settings = optional(target, "settings")
    return {
        "format": FORMAT, "version": VERSION, "specframe": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": target.name, "dtype": str(target.dtype).removeprefix("torch."),
        "engine": optional(target, "engine"),
        "max_new_tokens": max_new_tokens, "chat": chat, "recorded_with": [dict(p) for p in proposers],
        "target": {"vocab_size": target.vocab_size, "eos_token_ids": sorted(target.eos_token_ids),
                   "max_context": target.max_context, "supports_trees": bool(target.supports_trees),
                   "hidden_size": int(text.hidden_size), "num_hidden_layers": int(text.num_hidden_layers)},
        "machine": sf.machine_info() if settings is not None else None,
        "cost": {"ns": list(cost.ns), "t_ms": {str(c): v for c, v in cost.t_ms.items()},
                 "source": "machine profile (specframe tune) of the settings the target ran with"} if cost else None,
        "entropy": {"unit": "nats", "temperature": 1.0, "moments": ["H", "M2"]},
        "features": {"layers": {str(k): v for k, v in layers.items()}, "dtype": str(target.dtype).removeprefix("torch."),
                     "for": [e if isinstance(e, str) else e["name"] for e in features_for]} if layers else None,
        "questions": [{"question_id": q.question_id, "category": q.category, "prompt_tokens": len(q.prompt),
                       "new_tokens": len(q.generated), "finish_reason": q.finish_reason} for q in questions],
    }
