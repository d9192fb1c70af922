"""Stop conditions applied to each committed token in order: EOS, stop strings, max_new_tokens.

Nothing after the first stop is committed, streamed or counted. Stop strings are matched on the decoded text;
the token that completes a stop string is committed (as in HF transformers) and the text is cut before the
stop string (as in vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


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
        """How many of ``tokens`` to keep so that the first stop string is just completed, or None."""
        assert self.decode is not None, "stop strings need a tokenizer"
        text = self.decode(self.generated + tokens)
        if self._find(text) is None:
            self._scan_from = max(0, len(text) - max(map(len, self.stop_strings)))
            return None
        for m in range(1, len(tokens) + 1):  # rare: find the token that completed it
            at = self._find(self.decode(self.generated + tokens[:m]))
            if at is not None:
                self.stop_text_at = at
                return m
        return None  # pragma: no cover - the full text matched, so some prefix does

    def _find(self, text: str) -> int | None:
        hits = [i for s in self.stop_strings if (i := text.find(s, self._scan_from)) >= 0]
        return min(hits) if hits else None


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


@dataclass
class TextStream:
    """Turns committed token ids into text pieces, each character exactly once.

    Holds back text that ends in an incomplete multi-byte character (U+FFFD), as transformers' ``TextStreamer``
    does, and, with stop strings, the tail that could still become a stop string. The final piece comes from the
    request's ``text`` (see :func:`without_incomplete_character`), so the pieces always add up to it.
    """

    decode: Callable[[list[int]], str]
    emit: Callable[[str], None]
    holdback: int = 0  # longest stop string - 1
    sent: str = ""

    def update(self, generated: list[int], final: bool = False, final_text: str | None = None) -> None:
        text = final_text if final_text is not None else self.decode(generated)
        if not final:
            if text.endswith(REPLACEMENT):
                return
            text = text[: max(len(self.sent), len(text) - self.holdback)]
        if text.startswith(self.sent) and len(text) > len(self.sent):
            self.emit(text[len(self.sent) :])
            self.sent = text
