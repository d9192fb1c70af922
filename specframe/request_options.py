"""One request's options, validated once: what ``generate_result``, ``submit`` and ``generate_batch_results`` take.

The three entry points of :class:`~specframe.api.Specframe` take the same keywords, spelled once here
(:class:`RequestKeywords`, typed for editors with ``**keywords: Unpack[RequestKeywords]``); each hands them to
:func:`check_options` (of the loaded target and its config) and gets one :class:`RequestOptions`: the config's values
where the request gave none, every value checked once with the message naming it as the caller spelled it, the
constraint spec parsed. Prompts are checked by :func:`check_prompt` the same way for all three. A request then runs
from a ``RequestOptions`` and its prompt ids alone: its :class:`~specframe.decode.options.DecodeOptions` (``.decode``)
is what the decode loop takes, with the constraint compiled by a :class:`ConstraintCompiler`.
"""

from __future__ import annotations

import difflib
import threading
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence, TypedDict

from pydantic import ValidationError

from .config import RequestSettings, settings_error, validation_line
from .contracts.constraint import Constraint, ConstraintSpec
from .decode.options import DecodeOptions
from .errors import ConfigError, ConstraintError
from .sampling import SamplingParams, check_logprobs


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


_DECODE_FIELDS = ("max_new_tokens", "sampling", "seed", "stop", "logprobs", "on_text")


@dataclass(frozen=True, init=False)
class RequestOptions:
    """A request's options after validation (see the module docstring): its decode options plus what the face adds.

    ``decode``: the :class:`~specframe.decode.options.DecodeOptions` (max_new_tokens, sampling, seed, stop, logprobs,
    on_text; its ``constraint`` is None here: each request compiles its own, :meth:`decode_with`).
    ``constraint``: the parsed spec (None: unconstrained). ``proposers`` / ``merge`` / ``router``: the request's
    plugin overrides as given (None: the config's; resolved and built when its plugin set is leased,
    :meth:`Specframe.lease`). ``chat``: the prompt's chat template (None: the config's). ``question_id``: comes back
    as ``result.question_id``.
    """

    decode: DecodeOptions
    constraint: ConstraintSpec | None = None
    proposers: Any = None
    merge: Any = None
    router: Any = None
    chat: bool | None = None
    question_id: Any = None

    def __init__(self, decode: DecodeOptions | None = None, constraint: ConstraintSpec | None = None,
                 proposers: Any = None, merge: Any = None, router: Any = None, chat: bool | None = None,
                 question_id: Any = None, **fields: Any) -> None:
        if fields:  # the old RequestOptions(max_new_tokens=..., sampling=..., seed=..., stop=..., ...)
            unknown = set(fields) - set(_DECODE_FIELDS)
            if unknown or decode is not None:
                raise TypeError(f"RequestOptions() got unexpected keyword arguments {sorted(unknown or fields)}")
            from . import MOVED_UNTIL

            warnings.warn("RequestOptions(max_new_tokens=..., ...) is deprecated: pass RequestOptions(DecodeOptions("
                          "max_new_tokens=..., ...), ...) (specframe.decode.options; the old form goes in specframe "
                          f"{MOVED_UNTIL})", DeprecationWarning, stacklevel=2)
            decode = DecodeOptions(**fields)
        if decode is None:
            raise TypeError("RequestOptions() needs its DecodeOptions")
        for name, value in (("decode", decode), ("constraint", constraint), ("proposers", proposers),
                            ("merge", merge), ("router", router), ("chat", chat), ("question_id", question_id)):
            object.__setattr__(self, name, value)

    @property
    def sampling(self) -> SamplingParams:
        """The request's sampling (it chooses the verifier of its plugin set)."""
        assert self.decode.sampling is not None  # (check_options always sets it)
        return self.decode.sampling

    def __getattr__(self, name: str) -> Any:  # opts.max_new_tokens, opts.seed, ...: the decode options' fields
        if name in _DECODE_FIELDS:
            return getattr(self.decode, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def decode_with(self, constraint: Constraint | None) -> DecodeOptions:
        """The decode options with the request's own compiled ``constraint``."""
        return self.decode if constraint is None else replace(self.decode, constraint=constraint)


def check_chat(chat: Any) -> None:
    """``chat`` must be True, False or None (the config's): a string or number is refused, not read as truthy."""
    if chat is not None and not isinstance(chat, bool):
        raise ConfigError(f"chat must be True or False (or None for the config's), got {chat!r}")


def check_keywords(function: str, given: dict[str, Any], known: Sequence[str]) -> None:
    """Raise TypeError naming ``function`` (as the caller called it) for an unknown keyword, with the closest one."""
    for name in given:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}{hint}; it takes: "
                            f"{', '.join(known)}")


def constraint_spec(spec: ConstraintSpec | dict[str, Any] | None, config: Any) -> ConstraintSpec | None:
    """``spec`` parsed (None: the config's ``constraint``; None when neither sets one).

    Raises:
        ConstraintError: not exactly one of json_schema / json_object / regex / grammar, or not a mapping.
    """
    if spec is None:
        spec = config.constraint
        if spec is None:
            return None
    if isinstance(spec, dict):
        try:
            spec = ConstraintSpec.model_validate(spec)
        except ValidationError as exc:
            raise ConstraintError(validation_line(exc, "constraint")) from None
    if not isinstance(spec, ConstraintSpec):
        raise ConstraintError(f"constraint must be a mapping such as {{'json_schema': {{...}}}} or "
                              f"{{'regex': '...'}}, got {type(spec).__name__}")
    return spec


def check_options(function: str, keywords: dict[str, Any], known: Sequence[str], target: Any,
                  config: Any) -> RequestOptions:
    """A request's options from the keywords of the entry point ``function`` (named in an unknown keyword's error):
    the given values, else ``config``'s (valid already), checked against ``target`` (its tokenizer's special tokens).

    Raises:
        TypeError: an unknown keyword.
        ConfigError: a value out of range or of the wrong type; a stop string holding a special token and other
            text; a malformed constraint.
    """
    check_keywords(function, keywords, known)
    from .decode.stopping import special_stop_ids

    get = keywords.get
    on_text, chat, logprobs = get("on_text"), get("chat"), get("logprobs")
    if on_text is not None and not callable(on_text):
        raise ConfigError(f"on_text must be a function taking each new piece of text, got {on_text!r}")
    check_chat(chat)
    c, s = config, config.sampling
    defaults = {"max_new_tokens": c.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                "top_k": s.top_k, "seed": s.seed, "stop": c.stop}
    try:
        req = RequestSettings.model_validate({name: value if get(name) is None else get(name)
                                              for name, value in defaults.items()})
    except ValidationError as exc:
        raise ConfigError(settings_error(exc)) from None
    special_stop_ids(tuple(req.stop), target.tokenizer)  # a stop string that cannot match fails now
    check_logprobs(logprobs)
    decode = DecodeOptions(
        max_new_tokens=req.max_new_tokens, seed=req.seed, stop=tuple(req.stop), logprobs=logprobs, on_text=on_text,
        sampling=SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p))
    return RequestOptions(decode, constraint=constraint_spec(get("constraint"), config), proposers=get("proposers"),
                          merge=get("merge"), router=get("router"), chat=chat, question_id=get("question_id"))


def check_prompt(prompt: Any, chat: bool | None, target: Any, config: Any, index: int | None = None) -> list[int]:
    """The token ids of one prompt: text is encoded (with the chat template unless ``chat`` is False; None:
    ``config``'s); token ids are checked and used as they are. ``index``: the prompt's place in a batch (named in
    errors).

    Raises:
        ConfigError: lone UTF-16 surrogates, an id outside the vocabulary, an empty prompt, ``chat`` not a bool.
        PromptTooLongError: the prompt leaves no room in the model's context.
        TypeError: neither text nor a list of token ids.
    """
    from .errors import PromptTooLongError

    name = "the prompt" if index is None else f"prompt {index}"
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{name} holds a lone UTF-16 surrogate (\\u{ord(prompt[exc.start]):04x} at "
                              f"character {exc.start}), which is not text: pass valid Unicode") from None
        check_chat(chat)
        ids = target.encode_prompt(prompt, config.chat if chat is None else chat)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        check_chat(chat)
        bad = next((t for t in prompt if not 0 <= t < target.vocab_size), None)
        if bad is not None:
            raise ConfigError(f"{'prompt' if index is None else name}: token id {bad} is outside the model's "
                              f"vocabulary [0, {target.vocab_size})")
        ids = list(prompt)
    else:
        raise TypeError("prompt must be a str or a list of token ids (one prompt per call)")
    if not ids:
        raise ConfigError(f"{name} is empty: give at least one token")
    if len(ids) >= target.max_context:
        raise PromptTooLongError(f"{name} has {len(ids)} tokens; the model's context is "
                                 f"{target.max_context}: shorten it")
    return ids


def check_batch(prompts: Any, batch_size: Any, question_ids: Any, on_result: Any) -> list:
    """``prompts`` read into a list, after checking the batch-level arguments of ``generate_batch_results``.

    Raises:
        ConfigError: a bad ``batch_size``, no prompts or not a list, ``question_ids`` not one per prompt,
            ``on_result`` not callable.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(prompts, (str, bytes, dict)) or not isinstance(prompts, Iterable):
        raise ConfigError(f"prompts must be a non-empty list of prompts (text or token-id lists), got "
                          f"{type(prompts).__name__}")
    prompts = list(prompts)  # (an iterator or generator is read once, here)
    if not prompts:
        raise ConfigError("prompts must be a non-empty list of prompts (text or token-id lists)")
    if question_ids is not None and (isinstance(question_ids, (str, bytes, dict))
                                     or not isinstance(question_ids, Sequence)):
        raise ConfigError(f"question_ids must be a list (one id per prompt), got {type(question_ids).__name__}")
    if on_result is not None and not callable(on_result):
        raise ConfigError(f"on_result must be a function taking (index, result), got {on_result!r}")
    if question_ids is not None and len(question_ids) != len(prompts):
        raise ConfigError(f"question_ids has {len(question_ids)} entries for {len(prompts)} prompts")
    return prompts


class ConstraintCompiler:
    """Compiles each request's constraint for one loaded target by its config's ``constraint_engine`` (the engine
    made once, when first used; thread-safe)."""

    def __init__(self, target: Any, config: Any, registry: Any) -> None:
        self.target, self.config, self.registry = target, config, registry
        self.engine: Any = None
        self._lock = threading.Lock()

    def __call__(self, spec: ConstraintSpec | dict[str, Any] | None = None) -> Constraint | None:
        """One request's compiled constraint for ``spec`` (None: the config's ``constraint``; None when neither sets
        one).

        Raises:
            ConstraintError: ``spec`` is malformed, invalid or unsupported by the engine, or the model's tokenizer
                cannot be used for constraints.
            UnknownConstraintEngineError: ``constraint_engine`` names no installed engine.
        """
        spec = constraint_spec(spec, self.config)
        if spec is None:
            return None
        with self._lock:
            if self.engine is None:
                cls = self.registry.constraint_engine(self.config.constraint_engine)
                self.engine = cls(self.target.tokenizer, int(self.target.vocab_size),
                                  frozenset(self.target.eos_token_ids))
            engine = self.engine
        return engine.compile(spec)
