"""One request's decode options, spelled once below the face.

A :class:`DecodeOptions` is what the decode loop needs of a request beyond its prompt: how many tokens, how to sample,
the seed, stop strings, a compiled constraint, log-probabilities and a streaming callback. Every host hands the same
object down: :meth:`Engine.request <specframe.decode.engine.Engine.request>` takes it, the batch loop's
:class:`~specframe.decode.batch.BatchRequest` holds it, and :class:`~specframe.request_options.RequestOptions` (what
``Specframe.generate_result`` checks) is it plus the plugin overrides, ``chat`` and the question id. A new per-request
decode option is a field here and its use in :class:`~specframe.decode.engine.Request`.

    opts = DecodeOptions(max_new_tokens=64, sampling=SamplingParams(temperature=0.7), seed=7, stop=("\\n\\n",))
    result = engine.request(prompt_ids, opts).run()      # same as engine.generate(prompt_ids, max_new_tokens=64, ...)

``sampling`` None is the sampling the engine's verifier was chosen for (``sf.lease(sampling=...)``), so a host gives
it once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..sampling import SamplingParams

__all__ = ["DecodeOptions"]


@dataclass(frozen=True)
class DecodeOptions:
    """A request's decode options (see the module docstring).

    ``max_new_tokens``: tokens to generate at most (cut to the room the prompt leaves in the context).
    ``sampling``: temperature / top-k / top-p (None: the engine's, the one its verifier was chosen for; greedy when it
    has none). ``seed``: seeds the request's generator. ``stop``: stop strings (one that is a special token alone is
    matched by id). ``constraint``: the request's compiled
    :class:`~specframe.contracts.constraint.Constraint`, its own (None: unconstrained). ``logprobs``: alternatives
    kept per token (0: the chosen token's only; None: no log-probabilities). ``on_text``: called with each new piece
    of text.
    """

    max_new_tokens: int
    sampling: SamplingParams | None = None
    seed: int = 0
    stop: tuple[str, ...] = ()
    constraint: Any = None
    logprobs: int | None = None
    on_text: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stop, tuple):  # a list (or one string) given for stop strings
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
