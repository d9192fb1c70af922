"""Stop conditions applied to each committed token in order: EOS, stop strings, max_new_tokens.

Nothing after the first stop is committed, streamed or counted. Stop strings are matched on the decoded text as it
will be emitted (a character split over tokens counts once whole, never as the U+FFFD a half of it decodes to:
:func:`emitted_text`); the token that completes a stop string is committed (as in HF transformers)
and the text is cut before the stop string (as in vLLM).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class StopChecker:
    """Cuts each step's committed tokens at the first stop.

    Args:
        eos_token_ids: ids that end generation (the EOS is kept in the token ids, not in the text).
        max_new_tokens: the token limit: most generated tokens (>= 1).
        stop_strings: strings that end generation; need ``decode``.
        decode: ``list[int] -> str`` for generated ids (only used with stop strings).
    """

    eos_token_ids: frozenset[int]
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_text_at: int | None = None  # index in the decoded text where the matched stop string starts
    _scan_from: int = 0

    def feed(self, tokens: list[int]) -> list[int]:
        """Commit ``tokens`` up to and including the first stop; returns the committed part."""
        keep, reason = len(tokens), None
        for i, tok in enumerate(tokens):
            if tok in self.eos_token_ids:
                keep, reason = i + 1, "stop"
                break
            if len(self.generated) + i + 1 >= self.max_new_tokens:
                keep, reason = i + 1, "length"
                break
        if self.stop_strings:
            hit = self._first_stop_string(tokens[:keep])
            if hit is not None:
                keep, reason = hit, "stop"
        committed = tokens[:keep]
        self.generated.extend(committed)
        self.finish_reason = reason
        return committed

    def _first_stop_string(self, tokens: list[int]) -> int | None:
        """How many of ``tokens`` to keep so that the first stop string is just completed, or None. Matched on the
        text as it will be emitted: a character the tokens so far only began is held back until whole."""
        text = self._emitted(self.generated + tokens)
        if self._find(text) is None:
            self._scan_from = max(0, len(text) - max(map(len, self.stop_strings)))
            return None
        for m in range(1, len(tokens) + 1):  # rare: find the token that completed it
            at = self._find(self._emitted(self.generated + tokens[:m]))
            if at is not None:
                self.stop_text_at = at
                return m
        return None  # pragma: no cover - the full text matched, so some prefix does

    def _emitted(self, ids: list[int]) -> str:
        assert self.decode is not None, "stop strings need a tokenizer"
        return emitted_text(self.decode, ids)

    def _find(self, text: str) -> int | None:
        hits = [i for s in self.stop_strings if (i := text.find(s, self._scan_from)) >= 0]
        return min(hits) if hits else None


def special_stop_ids(stop_strings: tuple[str, ...], tokenizer: object) -> tuple[tuple[str, ...], frozenset[int]]:
    """Split stop strings into those matched on the decoded text and the special tokens among them, matched by id.

    Text is decoded without special tokens, so a stop string that is a special token (``"<|im_end|>"`` on a chat
    model) would never appear in it: it is matched by its token id instead, like an EOS (kept in ``token_ids``, not
    in the text, finish reason ``stop``).

    Returns:
        ``(text stop strings, special token ids)``.

    Raises:
        ConfigError: a stop string holding a special token together with other text (``"<|im_end|>\\n"``), which
            neither way can match.
    """
    from ..errors import ConfigError

    if tokenizer is None or not stop_strings:
        return stop_strings, frozenset()
    special = {str(t): i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
               if getattr(t, "special", False)}
    for tok in getattr(tokenizer, "all_special_tokens", None) or []:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int):
            special.setdefault(tok, tid)
    text, ids = [], set()
    for stop in stop_strings:
        if stop in special:
            ids.add(special[stop])
            continue
        inside = next((sp for sp in special if sp and sp in stop), None)
        if inside is not None:
            raise ConfigError(f"stop string {stop!r} contains the special token {inside!r}, which the decoded text "
                              f"never shows: give {inside!r} alone (matched by its token id) or text without it")
        text.append(stop)
    return tuple(text), frozenset(ids)


REPLACEMENT = "\ufffd"  # what a tokenizer decodes the bytes of an incomplete UTF-8 character to


def without_incomplete_character(text: str) -> str:
    """``text`` without the replacement characters (U+FFFD) at its very end.

    Byte-level tokenizers split a multi-byte character over several tokens; decoded before its last byte, the
    character shows as U+FFFD. transformers' ``TextStreamer`` never prints such a character while the next token
    may complete it; when the token limit (or an EOS) ends generation inside one, it can no longer complete, so
    specframe leaves it out of ``text`` and of the stream alike (its bytes stay in ``token_ids``). A replacement
    character at the very end is taken to be an incomplete one, as vLLM's and TGI's detokenizers do.
    """
    return text.rstrip(REPLACEMENT)


def emitted_text(decode: Callable[[list[int]], str], ids: Sequence[int], text: str | None = None) -> str:
    """The decode of ``ids`` (``text``, when the caller has it) as it will be emitted: without a character the last
    tokens began and did not finish (:func:`without_incomplete_character`).

    SentencePiece's byte fallback decodes a run of ``<0xNN>`` tokens that ends inside a character as one U+FFFD per
    byte, the whole characters before it in the run included (``日本`` and the first byte of ``語``: four U+FFFD): the
    text then is the decode of the ids before the incomplete character's tokens (at most three: a character has at
    most four bytes), so the whole characters are not taken back.
    """
    ids = list(ids)
    text = decode(ids) if text is None else text
    if not text.endswith(REPLACEMENT):
        return text
    held = without_incomplete_character(text)
    for back in range(1, min(3, len(ids)) + 1):
        before = decode(ids[:-back])
        if not before.endswith(REPLACEMENT):  # (a token that holds whole characters and the first bytes: kept)
            return held if held.startswith(before) else before
    return held


@dataclass(frozen=True)
class TokenPiece:
    """What one generated token adds to the returned text (:func:`token_pieces`).

    ``offset``: where its text begins in the returned text (a token that only begins a character: where that
    character will start); ``text``: the characters it completes ("" for a token holding the first part of a
    character split over tokens: the character goes with the token that completes it, as a stream shows it);
    ``context`` and ``shown``: the ids decoded before it in its window and how many characters of their decode
    are already in the text, so that ``decode([*context, other])[shown:]`` is what another token in its place would
    add (for alternatives' spellings).
    """

    offset: int
    text: str
    context: tuple[int, ...] = ()
    shown: int = 0


def token_pieces(decode: Callable[[list[int]], str], ids: Sequence[int], text: str | None = None) -> list[TokenPiece]:
    """Each of ``ids``' piece of ``text`` (the returned text: the decode of ``ids`` without an incomplete character
    at its end, cut before a stop string; None: the whole decode): the pieces join to ``text`` and each offset
    indexes it, also where tokens split a character (emoji, CJK in byte-level BPE or byte fallback).

    Decoded incrementally over a short window of recent tokens (as vLLM's and TGI's detokenizers: two short decodes
    per token); a tokenizer whose decode rewrites earlier text (``clean_up_tokenization_spaces``) falls back to
    decoding every prefix, so the pieces still join to the text.
    """
    ids = list(ids)
    full = emitted_text(decode, ids) if ids else ""
    target = full if text is None else text
    pieces: list[TokenPiece] = []
    start = shown = boundary = 0  # window start; its characters already shown; the last whole-character boundary
    for k in range(len(ids)):
        window = decode(ids[start : k + 1])
        grown = emitted_text(decode, ids[start : k + 1], window)
        pieces.append(TokenPiece(0, grown[shown:], tuple(ids[start:k]), shown))
        shown = max(shown, len(grown))
        if not window.endswith(REPLACEMENT):  # nothing held back: the next window starts at the last whole chunk
            if boundary > start:
                start = boundary
                shown = len(decode(ids[start : k + 1]))
            boundary = k + 1
    if "".join(p.text for p in pieces) != full:  # a decode that rewrites earlier text: every prefix, exactly
        pieces, at = [], 0
        for k in range(len(ids)):
            grown = emitted_text(decode, ids[: k + 1])
            upto = max(at, len(os.path.commonprefix([grown, full])))
            pieces.append(TokenPiece(0, full[at:upto]))
            at = upto
    out, at = [], 0
    for p in pieces:
        begin = min(at, len(target))
        at += len(p.text)
        out.append(TokenPiece(begin, target[begin : min(at, len(target))], p.context, p.shown))
    return out


def stop_prefix_length(text: str, stop_strings: tuple[str, ...]) -> int:
    """Length of the longest end of ``text`` that is the beginning of a stop string (and not a whole one): the text
    a stream must hold back because the next tokens may complete it into a stop string, which is then cut.

    Example: ``stop_prefix_length("so the END", ("ENDING", "x"))`` -> 3 (``"END"`` may become ``"ENDING"``);
    ``stop_prefix_length("so the", ("ENDING",))`` -> 0.
    """
    best = 0
    for stop in stop_strings:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def _before_last_space(text: str) -> str:
    """``text`` cut before its last whitespace character ("" without one)."""
    i = max((text.rfind(c) for c in (" ", "\n", "\t", "\r")), default=-1)
    return text[:i] if i > 0 else ""


@dataclass
class TextStream:
    """Turns committed token ids into text pieces, each character exactly once; the pieces always add up to the
    request's final ``text``.

    A piece is only text that later tokens cannot change: an incomplete multi-byte character at the end (U+FFFD) is
    held back, as transformers' ``TextStreamer`` does; so is the end of the text that could still grow into a stop
    string (:func:`stop_prefix_length`: only what matches a stop string's beginning, not the stop string's length);
    and, for a tokenizer whose decode rewrites earlier text (``clean_up_tokenization_spaces``: ``"it '"`` becomes
    ``"it's"`` once ``s`` arrives, ``"a ,"`` becomes ``"a,"``), the last word with the space before it
    (``hold_last_word``; switched on by itself the first time a decode does not extend the previous one). The final
    piece comes from the request's ``text`` (see :func:`emitted_text`).
    """

    decode: Callable[[list[int]], str]
    emit: Callable[[str], None]
    stop_strings: tuple[str, ...] = ()
    hold_last_word: bool = False
    sent: str = ""
    _last: str = ""  # the previous decode, without an incomplete character at its end

    def update(self, generated: list[int], final: bool = False, final_text: str | None = None) -> None:
        if final:
            text = final_text if final_text is not None else self.decode(generated)
        else:
            text = emitted_text(self.decode, generated)
            if not text.startswith(self._last):  # this decode rewrote earlier text: hold words back from now on
                self.hold_last_word = True
            self._last = text
            if self.hold_last_word:
                text = _before_last_space(text)
            text = text[: len(text) - stop_prefix_length(text, self.stop_strings)]
        if text.startswith(self.sent) and len(text) > len(self.sent):
            self.emit(text[len(self.sent) :])
            self.sent = text
        elif final and not text.startswith(self.sent):  # a decode that rewrote text far back: say so, never silently
            logging.getLogger("specframe").warning(
                "the streamed text differs from the final text: the tokenizer's decode rewrote %d streamed characters;"
                " the returned text is the right one", len(self.sent) - len(os.path.commonprefix([self.sent, text])))
