"""The built-in constraint engine, on llguidance (Microsoft's grammar engine: JSON schema, regex, Lark).

Why llguidance (lab/results/grammar-engines-avx512bf16, default tokenizer, 2-core AVX-512 BF16 EPYC): it compiles a
schema in 0.7-0.8 ms (xgrammar 4.7-7.4 ms), rolls back a 4-token draft in 0.4-0.5 µs and copies a state in ~2 µs;
its mask costs 11 µs per draft node (xgrammar 2-6 µs), 0.3 ms for a 24-node tree, against a target forward of 9 ms
or more here; and it is one wheel with no other native dependency. Both engines fit the contract; a third party can
register xgrammar's.

Trees without copies: one matcher walks the draft in topological order, rolling back to the path it shares with
each node's parent and consuming the parent's path from there (``rollback`` of one token is O(1)) before
checking the node's token; a token is checked (``validate_tokens``)
before it is consumed, since a matcher that consumed a forbidden token stays in its error state. An EOS node is
checked but never consumed: generation ends there, so nothing after it is reachable (its row and its children are
left unmasked / cut), and llguidance 1.9 does not restore a matcher's state when an EOS it consumed is rolled back
(measured: the mask after the rollback differed from the mask before).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..contracts.constraint import ConstraintSpec, check_schema_depth
from ..contracts.proposer import DraftTree
from ..errors import ConstraintError
from ..hookspecs import hookimpl

_SHIFTS = torch.arange(32, dtype=torch.int32)

# JSON is written in one layout, Python's json.dumps one ({"a": 1, "b": [2, 3]}): a model may not pad it with
# whitespace (with any whitespace allowed, small models loop on newlines until max_tokens, as vLLM's
# --disable-any-whitespace exists to stop), and the layout is forced, so the grammar proposer can draft it. A schema's
# own "x-guidance" options (llguidance's JsonCompileOptions) override this.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# A grammar that admits no finite output (a schema whose required part holds itself: {"type": "array", "items":
# {"$ref": "#"}, "minItems": 1}) compiles, and llguidance finds out only when it masks or consumes: its first mask is
# an error, or its first token sends the matcher into an endless forced expansion (an error). Compiling tries the
# first mask and, when it allows this many tokens or fewer, each of them (on copies of the matcher).
PROBE_FIRST_TOKENS = 4


def unpack_bitmask(bitmask: Tensor, vocab: int) -> Tensor:
    """``bitmask [R, ceil(V / 32)] int32`` (bit ``t % 32`` of word ``t // 32`` set: token ``t`` allowed, llguidance's
    and xgrammar's layout) -> ``[R, V] bool``, on ``bitmask``'s device."""
    shifts = _SHIFTS if bitmask.device.type == "cpu" else torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


class LLGuidanceConstraint:
    """One request's grammar state: an ``llguidance.LLMatcher`` past the committed tokens (see the module
    docstring). Follows :class:`specframe.contracts.constraint.Constraint`."""

    def __init__(self, matcher: Any, vocab: int, kind: str, eos: frozenset[int] = frozenset()) -> None:
        self.matcher, self.vocab, self.kind, self.eos = matcher, vocab, kind, eos
        self._words = (vocab + 31) // 32

    # --- walking a draft ------------------------------------------------------------------------------------
    def _walk(self, tokens: list[int], parents: list[int]) -> Iterator[tuple[int, bool]]:
        """``(node, allowed)`` for each node of a draft (``tokens``, ``parents``: its ``[N]`` lists) in order; while a
        node is yielded as allowed, the matcher stands after its path. The matcher is back at the committed state
        when the walk ends (or is closed)."""
        m = self.matcher
        ok = [False] * len(tokens)
        path: list[int] = []  # the allowed nodes the matcher consumed, root first
        try:
            for i, (tok, par) in enumerate(zip(tokens, parents)):
                if par >= 0 and not ok[par]:
                    yield i, False
                    continue
                chain = _ancestors(parents, par)  # the parent's path, root first (all allowed)
                keep = 0
                while keep < min(len(path), len(chain)) and path[keep] == chain[keep]:
                    keep += 1
                if len(path) > keep:  # back to the common prefix, then down to the parent
                    m.rollback(len(path) - keep)
                    del path[keep:]
                for node in chain[keep:]:
                    m.consume_token(tokens[node])
                    path.append(node)
                if tok in self.eos:  # allowed or not, never consumed: nothing follows it (see below)
                    yield i, self._allows(tok)
                    continue
                if self._allows(tok):
                    m.consume_token(tok)
                    path.append(i)
                    self._raise_if_error()
                    ok[i] = True
                yield i, ok[i]
        finally:
            if path:
                m.rollback(len(path))

    def _raise_if_error(self) -> None:
        """Raises ConstraintError (one line) when the matcher is in its error state: the grammar cannot go on."""
        if self.matcher.is_error():
            raise ConstraintError(f"the {self.kind} constraint cannot go on: {_first(self.matcher.get_error())}")

    def _allows(self, token: int) -> bool:
        """The matcher may consume ``token`` now. (llguidance 1.9's ``validate_tokens`` refuses EOS once a Lark
        grammar has stopped, while its mask allows it and ``consume_token`` takes it: EOS is allowed when the
        grammar accepts.)"""
        m = self.matcher
        return m.validate_tokens([token]) == 1 or (token in self.eos and m.is_accepting())

    def allowed_prefix(self, draft: DraftTree) -> int:
        for i, allowed in self._walk(draft.token_ids[0].tolist(), draft.parent[0].tolist()):
            if not allowed:
                return i
        return draft.num_nodes

    def _fill(self, bitmask: Tensor, row: int) -> None:
        """The allowed tokens of the matcher's state into ``bitmask[row]`` (``[R, ceil(V / 32)]`` int32, CPU,
        contiguous). (Not ``llguidance.torch.fill_next_token_bitmask``: importing that module compiles a kernel with
        torch.compile, ~2 s on the first request.)"""
        word = bitmask[row]
        self.matcher.unsafe_compute_mask_ptr(word.data_ptr(), word.numel() * word.element_size())

    def mask(self, draft: DraftTree, logits: Tensor) -> Tensor:
        """See :meth:`Constraint.mask`. The rows' packed bitmask (``[N + 1, ceil(V / 32)]`` int32, 1/32 of a bool
        mask's size at 4 bytes per word) is filled on the host, in a NumPy buffer (llguidance writes it; no tensor is
        read), copied to ``logits``' device once and unpacked there (the arithmetic of
        ``llguidance.torch.apply_token_bitmask_inplace``, without its ``torch.compile``); unreachable rows get every
        bit set."""
        n = draft.num_nodes
        self._raise_if_error()
        words = np.zeros((n + 1, self._words), dtype=np.int32)
        bitmask = torch.from_numpy(words)  # shares the buffer: llguidance fills it through the tensor's pointer
        self._fill(bitmask, 0)
        self._raise_if_error()
        reached = np.zeros(n + 1, dtype=bool)  # rows whose path the grammar allows (and that are not after an EOS)
        reached[0] = True
        tokens, parents = draft.token_ids[0].tolist(), draft.parent[0].tolist()
        for i, allowed in self._walk(tokens, parents):
            if allowed and tokens[i] not in self.eos:
                self._fill(bitmask, i + 1)
                reached[i + 1] = True
        if not words[0].any():
            raise ConstraintError(f"the {self.kind} constraint admits no token here (the grammar cannot go on)")
        words[~reached] = -1  # unreachable rows: every bit set, left as they are
        width = logits.shape[-1]
        if width != self.vocab:
            raise ConstraintError(f"the target's logits have {width} columns, the constraint was built for {self.vocab}")
        allowed = unpack_bitmask(bitmask.to(logits.device), self.vocab)  # [N + 1, V] bool, on the logits' device
        return logits.masked_fill(~allowed.unsqueeze(0), float("-inf"))

    def commit(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if not self._allows(token):
                raise ConstraintError(f"token {token} was committed but the {self.kind} constraint forbids it")
            self.matcher.consume_token(token)
            self._raise_if_error()

    @contextlib.contextmanager
    def _after(self, path: Sequence[int]) -> Iterator[bool]:
        """The matcher stands after ``path`` inside the block (False when the grammar forbids it, or it holds an EOS,
        after which nothing follows); back at the committed state after it."""
        m, done = self.matcher, 0
        try:
            for token in path:
                if token in self.eos or not self._allows(token):
                    yield False
                    return
                m.consume_token(token)
                done += 1
            yield True
        finally:
            if done:
                m.rollback(done)

    def forced(self, limit: int, after: Sequence[int] = ()) -> list[int]:
        if limit < 1:
            return []
        with self._after(after) as there:
            if not there or self.matcher.is_stopped():
                return []
            return list(self.matcher.compute_ff_tokens())[:limit]

    def choices(self, limit: int, after: Sequence[int] = ()) -> list[int] | None:
        with self._after(after) as there:
            if not there or self.matcher.is_stopped():
                return []
            bitmask = torch.zeros((1, self._words), dtype=torch.int32)
            self._fill(bitmask, 0)
        if int(torch.count_nonzero(bitmask)) > limit:  # each word holds one allowed token or more
            return None
        allowed = unpack_bitmask(bitmask, self.vocab)[0].nonzero().flatten().tolist()
        return allowed if len(allowed) <= limit else None


class LLGuidanceEngine:
    """Compiles :class:`~specframe.contracts.constraint.ConstraintSpec` s with llguidance for one tokenizer.

    Raises (``__init__``):
        ConstraintError: llguidance is not installed, the tokenizer is not a fast (Rust) tokenizer, or the model
            has no EOS token (a finished constraint allows only EOS).
    """

    name: ClassVar[str] = "llguidance"
    _bytes_engine: ClassVar[Any] = None  # the engine over a byte-level vocabulary that :meth:`check` compiles with
    _bytes_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def check(cls, spec: ConstraintSpec) -> None:
        """Refuse ``spec`` if no model could decode under it: invalid or unsupported, nested too deep, or admitting
        no output (compiled over a vocabulary of the 256 bytes, which spells any text a tokenizer can). Called on a
        config file's ``constraint:`` when it loads (:func:`specframe.config.load_config`).

        Raises:
            ConstraintError: as :meth:`compile`.
        """
        with cls._bytes_lock:
            if cls._bytes_engine is None:
                cls._bytes_engine = cls(_ByteTokenizer(), 257, [256])
            engine = cls._bytes_engine
        engine.compile(spec)

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int] | Sequence[int]) -> None:
        try:
            import llguidance
            import llguidance.hf
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise ConstraintError(f"constraints need the llguidance package ({exc}): pip install llguidance") from None
        eos = sorted(int(t) for t in eos_token_ids)
        if not eos:
            raise ConstraintError("the model has no EOS token: a constraint needs one to end the output")
        try:
            if isinstance(tokenizer, _ByteTokenizer):
                self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(tokenizer), n_vocab=int(vocab_size),
                                                        eos_token=eos)
            else:
                self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=int(vocab_size), eos_token=eos)
        except Exception as exc:  # noqa: BLE001 - llguidance's own error, made one line
            raise ConstraintError(f"llguidance cannot read this model's tokenizer ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}); constraints need a fast "
                                  "(Rust) transformers tokenizer") from None
        self.vocab, self.eos = int(vocab_size), frozenset(eos)
        self._lock = threading.Lock()  # (grammar compilation is cached per spec text; requests come from threads)
        self._grammars: dict[str, str] = {}
        self._admits: set[str] = set()  # the specs whose first tokens were tried and admit an output (:meth:`compile`)

    @staticmethod
    def _key(spec: ConstraintSpec) -> str:
        """The cache key of ``spec`` (its JSON), after the depth check: pydantic's serializer stops at 255 levels,
        with an error that is not specframe's (a spec is checked when made; this catches one whose schema was
        changed in place since).

        Raises:
            ConstraintError: the schema nests more than MAX_SCHEMA_DEPTH levels.
        """
        if spec.json_schema is not None:
            try:
                check_schema_depth(spec.json_schema, "json_schema")
            except ValueError as exc:
                raise ConstraintError(str(exc)) from None
        return spec.model_dump_json()

    def grammar(self, spec: ConstraintSpec) -> str:
        """llguidance's grammar text for ``spec``, checked (cached by spec).

        Raises:
            ConstraintError: invalid or unsupported (llguidance's message, first line), or nested too deep.
        """
        return self._grammar(spec, self._key(spec))

    def _grammar(self, spec: ConstraintSpec, key: str) -> str:
        from llguidance import LLMatcher

        with self._lock:
            if key in self._grammars:
                return self._grammars[key]
        try:
            if spec.json_schema is not None:
                text = LLMatcher.grammar_from_json_schema(spec.json_schema, defaults=JSON_LAYOUT)
            elif spec.json_object:
                text = LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
            elif spec.regex is not None:
                text = LLMatcher.grammar_from_regex(spec.regex)
            else:
                text = LLMatcher.grammar_from_lark(spec.grammar or "")
        except (ValueError, TypeError) as exc:
            raise ConstraintError(f"invalid {spec.kind}: {_first(str(exc))}") from None
        error = LLMatcher.validate_grammar(text, self.tokenizer)
        if error:
            raise ConstraintError(f"invalid {spec.kind}: {_first(error)}")
        with self._lock:
            self._grammars[key] = text
        return text

    def compile(self, spec: ConstraintSpec) -> LLGuidanceConstraint:
        from llguidance import LLMatcher

        key = self._key(spec)
        matcher = LLMatcher(self.tokenizer, self._grammar(spec, key), log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"invalid {spec.kind}: {_first(matcher.get_error())}")
        if key not in self._admits:  # (once per spec: the answer depends on the grammar and the tokenizer only)
            self._refuse_if_empty(matcher, spec)
            with self._lock:
                self._admits.add(key)
        return LLGuidanceConstraint(matcher, self.vocab, spec.kind, self.eos)

    def _refuse_if_empty(self, matcher: Any, spec: ConstraintSpec) -> None:
        """Refuse a grammar that admits no output, before any decoding (see :data:`PROBE_FIRST_TOKENS`): its first
        mask is an error, or allows only EOS where the empty output is not accepted, or each of its first tokens
        (when there are few) sends the matcher into its error state. Tried on copies: ``matcher`` is left as it was.

        Raises:
            ConstraintError: one line, llguidance's reason in it.
        """
        probe = matcher.deep_copy()
        bitmask = torch.zeros((1, (self.vocab + 31) // 32), dtype=torch.int32)
        probe.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())
        if probe.is_error():
            raise _admits_nothing(spec, _first(probe.get_error()))
        first = [t for t in unpack_bitmask(bitmask, self.vocab)[0].nonzero().flatten().tolist() if t not in self.eos]
        if not first:
            if probe.is_accepting():  # (only the empty output)
                return
            raise _admits_nothing(spec, "no token can start it")
        if len(first) > PROBE_FIRST_TOKENS:
            return
        reason = ""
        for token in first:
            trial = probe.deep_copy()  # (after the mask, as in decoding: only then does consuming a token expand
            trial.consume_token(token)  # what it forces, and fail where that has no end)
            if not trial.is_error():
                return
            reason = _first(trial.get_error())
        raise _admits_nothing(spec, f"after its first token, {reason}")


def _admits_nothing(spec: ConstraintSpec, reason: str) -> ConstraintError:
    reason = reason.split("; try avoiding")[0]  # (llguidance's advice on lexemes does not apply to such a schema)
    if spec.kind == "json_schema":
        return ConstraintError(f"invalid json_schema: it admits no JSON value the grammar engine can write "
                               f"(llguidance: {reason}); a schema whose required part holds itself has no finite "
                               "value (e.g. items {\"$ref\": \"#\"} with minItems 1, or a required property "
                               "referring to its own object): make that part optional")
    return ConstraintError(f"invalid {spec.kind}: it admits no output (llguidance: {reason})")


class _ByteTokenizer:
    """A vocabulary of the 256 bytes and EOS (256), in the shape ``llguidance.TokenizerWrapper`` reads: what
    :meth:`LLGuidanceEngine.check` compiles over when no model's tokenizer is at hand."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text: Any) -> list[int]:
        return list(text if isinstance(text, bytes) else str(text).encode("utf-8"))


def _ancestors(parents: list[int], node: int) -> list[int]:
    """``node`` and its ancestors, root first (``[]`` for -1, the committed tokens)."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def _first(message: str) -> str:
    """llguidance's messages are multi-line (a caret under the source): the first line, plus where it points."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return "(no message)"
    cause = next((ln for ln in lines[1:] if ln.startswith("error:")), None)  # (a regex error's cause comes later)
    return lines[0] + (f" {cause}" if cause else "")


@hookimpl
def specframe_register_constraint_engines(register) -> None:
    register(LLGuidanceEngine)
