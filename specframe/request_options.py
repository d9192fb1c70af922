"""One request's options, validated once: what ``generate_result``, ``submit`` and ``generate_batch_results`` take.

The three entry points of :class:`~specframe.api.Specframe` take the same keywords, spelled once here
(:class:`RequestKeywords`, typed for editors with ``**keywords: Unpack[RequestKeywords]``); each hands them to
:meth:`Specframe.options` and gets one :class:`RequestOptions`:
the config's values where the request gave none, every value checked once with the message naming it as the caller
spelled it, the constraint spec parsed. Prompts are checked by :meth:`Specframe.prompt_ids` the same way for all
three. A request then runs from a ``RequestOptions`` and its prompt ids alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypedDict

from .contracts.constraint import ConstraintSpec
from .sampling import SamplingParams


class BatchKeywords(TypedDict, total=False):
    """The keywords every request entry point takes (``generate_batch_results`` takes these); each left out or None
    is the config's.

    Keys:
        proposers: proposer configs or names (``"ngram"`` alone is short for ``[{"name": "ngram"}]``).
        max_new_tokens: tokens to generate at most.
        temperature / top_p / top_k / seed: sampling (temperature 0: greedy); ``seed`` seeds the request's generator.
        stop: stop strings (cut from the text; one that is a special token alone is matched by id).
        chat: apply the tokenizer's chat template to a text prompt.
        merge / router: as in the config file; they apply when two or more proposers are combined (the router also
            trims a lone proposer's draft when set explicitly or on a target with a measured cost curve).
        constraint: structured output, ``{"json_schema": {...}}``, ``{"json_object": True}``, ``{"regex": "..."}`` or
            ``{"grammar": "<Lark>"}`` (a :class:`~specframe.contracts.constraint.ConstraintSpec`): the output matches
            it and equals constrained decoding without speculation (docs/structured-output.md).
        logprobs: keep each generated token's log-probability and this many likeliest alternatives (0: the chosen
            token's only) in ``result.logprobs`` (:class:`~specframe.decode.engine.TokenLogprob`).
    """

    proposers: Sequence[dict[str, Any] | str] | str | None
    max_new_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: Sequence[str] | str | None
    chat: bool | None
    merge: dict[str, Any] | str | None
    router: dict[str, Any] | str | None
    constraint: ConstraintSpec | dict[str, Any] | None
    logprobs: int | None


class RequestKeywords(BatchKeywords, total=False):
    """The keywords of one request (``generate_result``, ``submit``, ``generate``): :class:`BatchKeywords` and

    Keys:
        question_id: comes back as ``result.question_id``.
        on_text: called with each new piece of text as it is decoded.
    """

    question_id: Any
    on_text: Callable[[str], None] | None


REQUEST_KEYWORDS: tuple[str, ...] = tuple(RequestKeywords.__annotations__)
BATCH_KEYWORDS: tuple[str, ...] = tuple(BatchKeywords.__annotations__)


@dataclass(frozen=True)
class RequestOptions:
    """A request's options after validation (see the module docstring).

    ``proposers`` / ``merge`` / ``router``: the request's plugin overrides as given (None: the config's; resolved
    and built when its plugin set is leased, :meth:`Specframe.lease`). ``constraint``: the parsed spec (None:
    unconstrained); each request compiles its own. ``stop``: stop strings (text; special-token ones are matched by
    id). ``logprobs``: alternatives kept per token (None: no log-probabilities).
    """

    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    stop: tuple[str, ...]
    proposers: Any = None
    merge: Any = None
    router: Any = None
    constraint: ConstraintSpec | None = None
    logprobs: int | None = None
    chat: bool | None = None
    on_text: Callable[[str], None] | None = None
    question_id: Any = None
