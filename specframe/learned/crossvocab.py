"""Two tokenizers over one text: what a draft with its own vocabulary needs to draft for a target.

- :class:`TextBridge` turns the target's committed tokens into the draft's tokens of the same text (the prompt with
  the draft's own chat template, the answer re-encoded whole each step, so the draft never drifts from the
  committed text), and the draft's continuation text back into target tokens (re-encoding a window of committed
  target tokens with it and keeping what follows them: transformers' Universal Assisted Generation, UAG).
- :func:`shared_tokens` maps the tokens both vocabularies hold with the same text (token-level intersection, as in
  vLLM's TLI drafting): a draft restricted to them proposes target tokens one for one.
- :func:`check_lossless` refuses a draft tokenizer that cannot spell the target's text.

Both directions go through text, so a mismatch can only cost acceptance: the target verifies target tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from specframe.errors import ConfigError

_SENTINEL = "\x1fspecframe-user-turn\x1f"


def _decode(tok: Any, ids: Sequence[int], special: bool = False) -> str:
    return tok.decode(list(ids), skip_special_tokens=not special, clean_up_tokenization_spaces=False)


def _encode(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False)) if text else []


def user_turn(tok: Any) -> tuple[str, str] | None:
    """The chat template's text around one user turn with the generation prompt: ``(before, after)``, or None for a
    tokenizer without a template (or one that does not echo the content)."""
    if not getattr(tok, "chat_template", None):
        return None
    try:
        text = tok.apply_chat_template([{"role": "user", "content": _SENTINEL}], add_generation_prompt=True,
                                       tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses a lone user turn: treat the prompt as plain text
        return None
    if not isinstance(text, str) or text.count(_SENTINEL) != 1:
        return None
    before, _, after = text.partition(_SENTINEL)
    return before, after


def check_lossless(draft_tok: Any, target_tok: Any, target_vocab: int, what: str, sample: int = 4096) -> None:
    """Refuse a draft tokenizer that cannot spell the target's text: the text of (up to ``sample``, evenly spaced)
    target tokens must come back unchanged from the draft's encode / decode round trip.

    Raises:
        ConfigError: names the first character that does not come back.
    """
    step = max(1, target_vocab // sample)
    text = "".join(p for p in piece_texts(target_tok, range(0, target_vocab, step)) if p)
    back = _decode(draft_tok, _encode(draft_tok, text))
    if back != text:
        at = next((i for i, (a, b) in enumerate(zip(text, back)) if a != b), min(len(text), len(back)))
        ch = text[at] if at < len(text) else "<end>"
        raise ConfigError(f"{what}'s tokenizer cannot encode the target's text (it loses {ch!r}, e.g. no byte "
                          "fallback); use a draft whose tokenizer spells any text (byte-level BPE, or byte fallback)")


def piece_texts(tok: Any, ids: Sequence[int]) -> list[str | None]:
    """The text each token id in ``ids`` adds after another token (``decode([anchor, id])`` minus
    ``decode([anchor])``, which keeps a SentencePiece word's leading space); None for special tokens, ids past the
    tokenizer's vocabulary and pieces that are not whole characters (byte tokens)."""
    anchor = _encode(tok, "a")[:1] or [0]
    head = _decode(tok, anchor, special=True)
    size = len(tok)
    ids = [int(i) for i in ids]
    texts = tok.batch_decode([anchor + [i] for i in ids if i < size], skip_special_tokens=False,
                             clean_up_tokenization_spaces=False)
    special = set(getattr(tok, "all_special_ids", ()) or ())
    out: list[str | None] = []
    it = iter(texts)
    for i in ids:
        t = next(it) if i < size else None
        piece = t[len(head):] if t is not None and t.startswith(head) else ""
        out.append(piece if piece and i not in special and "\ufffd" not in piece else None)
    return out


def shared_tokens(target_tok: Any, target_vocab: int, draft_tok: Any, draft_vocab: int) -> tuple[Tensor, Tensor]:
    """Token-level intersection: ``(draft_ids [M] int64, target_ids [M] int64)``, the pairs whose pieces have the same
    text (the first target id where a text has several), ordered by draft id.

    Raises:
        ConfigError: the vocabularies share no token.
    """
    by_text: dict[str, int] = {}
    for i, piece in enumerate(piece_texts(target_tok, range(target_vocab))):
        if piece is not None and piece not in by_text:
            by_text[piece] = i
    pairs = [(j, by_text[p]) for j, p in enumerate(piece_texts(draft_tok, range(draft_vocab))) if p is not None and p in by_text]
    if not pairs:
        raise ConfigError("the draft's and the target's vocabularies share no token: use mapping: text")
    d, t = zip(*pairs)
    return torch.tensor(d, dtype=torch.int64), torch.tensor(t, dtype=torch.int64)


class TextBridge:
    """Target tokens -> draft tokens of the same text, and draft text -> target tokens.

    Args:
        target_tok, draft_tok: transformers tokenizers (lossless: see :func:`check_lossless`).
        window: committed target tokens re-encoded with a draft's text (:meth:`to_target`), so that a target token
            that would join the committed tail and the new text is found as the target would write it.
    """

    def __init__(self, target_tok: Any, draft_tok: Any, window: int = 4) -> None:
        self.t, self.d, self.window = target_tok, draft_tok, window
        self._target_turn = user_turn(target_tok)
        self._draft_turn = user_turn(draft_tok) is not None

    def draft_prompt(self, prompt_ids: Sequence[int]) -> list[int] | None:
        """The draft's tokens for a target prompt that is one user turn of the target's chat template, re-written in
        the draft's template (its content re-encoded); None for any other prompt (see :meth:`draft_ids`)."""
        if self._target_turn is None or not self._draft_turn:
            return None
        text = _decode(self.t, prompt_ids, special=True)
        before, after = self._target_turn
        if not (text.startswith(before) and text.endswith(after) and len(text) >= len(before) + len(after)):
            return None
        content = text[len(before) : len(text) - len(after)]
        enc = self.d.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)
        return list(enc["input_ids"])

    def draft_ids(self, prompt: list[int] | None, committed: Sequence[int], prompt_len: int) -> tuple[list[int], int, str]:
        """The draft's tokens of the committed text: ``(ids, n_prompt, text)``. With a re-written prompt
        (``prompt``, from :meth:`draft_prompt`) they are that prompt and the answer's text re-encoded; otherwise the
        whole committed text re-encoded (``n_prompt`` 0). ``text`` is the text of ``ids[n_prompt:]``. Re-encoding
        whole each step keeps the draft on the committed text; its cache is rolled back to the common prefix."""
        if prompt is not None:
            text = _decode(self.t, committed[prompt_len:])
            return prompt + _encode(self.d, text), len(prompt), text
        text = _decode(self.t, committed)
        return list(self.d.encode(text, add_special_tokens=True)), 0, text

    def draft_text(self, own_ids: Sequence[int], new_ids: Sequence[int], text: str) -> str:
        """The text the draft's ``new_ids`` add after its tokens ``own_ids`` (whose text is ``text``)."""
        whole = _decode(self.d, list(own_ids) + list(new_ids))
        if whole.startswith(text):
            return whole[len(text):]
        return _decode(self.d, new_ids)

    def to_target(self, committed: Sequence[int], text: str) -> list[int]:
        """Target tokens that write ``text`` after the committed target tokens ``committed`` (their tail, at least
        :attr:`window` tokens when there are): the tail's text and ``text`` re-encoded, kept where the re-encoding
        starts with the tail's own tokens (first the whole window, then shorter tails, then ``text`` alone)."""
        if not text:
            return []
        for w in range(min(self.window, len(committed)), 0, -1):
            tail = list(committed[-w:])
            enc = _encode(self.t, _decode(self.t, tail, special=True) + text)
            if enc[:w] == tail and len(enc) > w:
                return enc[w:]
        return _encode(self.t, text)
