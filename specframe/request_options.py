"""One request's options, validated once: what ``generate_result``, ``submit`` and ``generate_batch_results`` take.

The three entry points of :class:`~specframe.api.Specframe` spell the same keywords (they are the public face, each
documented where it is called); each hands them to :meth:`Specframe.options` and gets one :class:`RequestOptions`:
the config's values where the request gave none, every value checked once with the message naming it as the caller
spelled it, the constraint spec parsed. Prompts are checked by :meth:`Specframe.prompt_ids` the same way for all
three. A request then runs from a ``RequestOptions`` and its prompt ids alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .contracts.constraint import ConstraintSpec
from .sampling import SamplingParams


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
