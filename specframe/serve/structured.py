"""Structured output and log-probabilities in the OpenAI API of ``specframe serve``.

- ``response_format`` -> a constraint: ``json_object`` is JSON mode (any JSON object), ``json_schema`` the schema it
  carries (``strict`` or not, the schema is enforced in full); ``text`` is no constraint.
- ``tools`` + ``tool_choice`` -> a constraint on the answer, returned as OpenAI ``tool_calls``: a named function
  (``{"type": "function", "function": {"name": ...}}``) constrains the answer to that function's ``parameters``
  schema; ``required`` to ``{"name": <one of the tools>, "arguments": <its parameters>}``; ``none`` leaves the
  answer free. One call per answer here. ``auto`` (OpenAI's default when tools are given) reads the model's own
  tool-call format and is planned by :mod:`specframe.serve.tool_calling`, which calls this for everything else.
- ``logprobs``: each token's log-probability (and ``top_logprobs`` alternatives) from the verification forward,
  raw logits (:class:`specframe.decode.engine.TokenLogprob`), in the chat (``{"content": [...]}``) and the
  completions (``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``) shapes. A stream carries them
  in its finish chunk (a client that joins each chunk's list gets the whole list).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from ..decode.stopping import TokenPiece, token_pieces
from .schemas import NamedToolChoice


class StructuredRequestError(ValueError):
    """A request whose structured-output fields cannot be served (a 400 naming ``param``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCalls:
    """The answer is a tool call: of ``name`` (its arguments are the whole answer), or of any tool (the answer is
    ``{"name": ..., "arguments": ...}``) when ``name`` is None."""

    name: Optional[str]


def request_constraint(body: Any) -> tuple[Optional[dict[str, Any]], Optional[ToolCalls]]:
    """The constraint a body asks for (as :meth:`specframe.api.Specframe.submit` takes it; None: none) and whether the
    answer is a tool call.

    Raises:
        StructuredRequestError: ``tool_choice`` auto (or tools without a tool_choice: plan those with
            :func:`specframe.serve.tool_calling.plan`), or both a tool call and a ``response_format`` other than text.
    """
    fmt = body.response_format
    constraint: Optional[dict[str, Any]] = None
    if fmt is not None and fmt.type == "json_object":
        constraint = {"json_object": True}
    elif fmt is not None and fmt.type == "json_schema":
        constraint = {"json_schema": fmt.json_schema.schema_}
    tools = getattr(body, "tools", None)
    choice = getattr(body, "tool_choice", None)
    if not tools or choice == "none":
        return constraint, None
    if choice is None or choice == "auto":
        raise StructuredRequestError(
            "tool_choice auto (OpenAI's default when tools are given) needs a tool-call parser of this model's "
            "format: set tool_choice to \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}} (the "
            "answer is then constrained to a call), or to \"none\"", "tool_choice")
    if constraint is not None:
        raise StructuredRequestError("a tool call and a response_format constrain the same answer: give one of them",
                                     "response_format")
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return {"json_schema": tool.function.parameters}, ToolCalls(tool.function.name)
    calls = [{"type": "object", "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return {"json_schema": calls[0] if len(calls) == 1 else {"anyOf": calls}}, ToolCalls(None)


def tool_calls(text: str, calls: ToolCalls) -> Optional[list[dict[str, Any]]]:
    """The answer ``text`` as OpenAI ``tool_calls`` (``arguments`` a JSON string); None when it is not a complete
    call (an answer cut by ``max_tokens``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if calls.name is not None:
        name, arguments = calls.name, value
    elif isinstance(value, dict) and "name" in value and "arguments" in value:
        name, arguments = value["name"], value["arguments"]
    else:
        return None
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}]


def _piece(tokenizer: Any, token: int) -> str:
    return tokenizer.decode([token]) if tokenizer is not None else str(token)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet read backwards: the printable character standing for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTES = _byte_decoder()


def _token_bytes(tokenizer: Any, token: int, text: str) -> list[int]:
    """The UTF-8 bytes a token stands for (OpenAI's ``bytes``): a token holding part of a character decodes to
    U+FFFD alone, so its bytes come from the vocabulary entry (byte-level BPE, or SentencePiece's ``<0xNN>``)."""
    if "\ufffd" in text and tokenizer is not None:
        piece = tokenizer.convert_ids_to_tokens(token)
        if isinstance(piece, str):
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return [int(piece[3:5], 16)]
            if piece and all(c in _BYTES for c in piece):
                return [_BYTES[c] for c in piece]
    return list(text.encode("utf-8"))


def _emitted(result: Any, tokenizer: Any) -> list[Any]:
    """The log-probabilities of the tokens the answer's text shows: without a special token (EOS) that ended it."""
    entries = list(result.logprobs)
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    if entries and result.finish_reason == "stop" and entries[-1].token_id in special:
        entries.pop()
    return entries


def chat_logprobs(result: Any, tokenizer: Any) -> Optional[dict[str, Any]]:
    """``choice.logprobs`` of a chat completion (None when the request did not ask): one entry per token of the
    content (an EOS that ended the answer has none, as in OpenAI's API).

    Each entry (and alternative) is spelled by :func:`_chat_token`: ``bytes`` are the token's own UTF-8 bytes, so the
    entries' bytes join to the content, also where tokens split a character or a decode drops a word's leading space;
    ``token`` is their text, or for a token holding part of a character its bytes escaped (``\\xf0\\x9f``):
    distinct tokens keep distinct spellings.
    """
    if result.logprobs is None:
        return None
    entries = _emitted(result, tokenizer)
    if tokenizer is None:
        return {"content": [{"token": str(t.token_id), "logprob": t.logprob, "bytes": list(str(t.token_id).encode()),
                             "top_logprobs": [{"token": str(i), "logprob": v, "bytes": list(str(i).encode())}
                                              for i, v in t.top]} for t in entries]}

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    def entry(token: int, logprob: float, piece: TokenPiece) -> dict[str, Any]:
        text, raw = _chat_token(tokenizer, decode, token, piece)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    pieces = token_pieces(decode, [t.token_id for t in entries])
    return {"content": [{**entry(t.token_id, t.logprob, p), "top_logprobs": [entry(i, v, p) for i, v in t.top]}
                        for t, p in zip(entries, pieces)]}


def _chat_token(tokenizer: Any, decode: Any, token: int, piece: TokenPiece) -> tuple[str, bytes]:
    """``(token, bytes)`` of ``token`` in a chat logprobs entry at ``piece``'s position (the chosen token's or an
    alternative's): a token holding part of a character (its decode alone is U+FFFD) has its vocabulary bytes,
    spelled ``\\xNN`` each as DeepSeek's chat API writes them; any other token, the text it adds after
    the tokens before it (a SentencePiece word start's space included, which its decode alone drops)."""
    own = _piece(tokenizer, token)
    if "\ufffd" in own:
        raw = bytes(_token_bytes(tokenizer, token, own))
        try:
            return raw.decode("utf-8"), raw  # (a token whose text is U+FFFD itself)
        except UnicodeDecodeError:
            return "".join(f"\\x{b:02x}" for b in raw), raw
    window = decode([*piece.context, token])
    added = window[piece.shown:]
    text = added if added and "\ufffd" not in added else own
    return text, text.encode("utf-8")


def completion_logprobs(result: Any, tokenizer: Any) -> Optional[dict[str, Any]]:
    """``choice.logprobs`` of a completion (the legacy shape; None when the request did not ask), one entry per
    token of the text.

    ``tokens`` join to the returned text and ``text_offset`` indexes it, also where tokens split a character
    (:func:`~specframe.decode.stopping.token_pieces`: a token holding the first part of a character adds "" at the
    offset where the character starts; the token that completes it, the character). ``top_logprobs`` (a dict per
    token) has a distinct key for each distinct token, the chosen token's being its ``tokens`` entry, and the
    chosen token also when it is not among the most likely (OpenAI: up to ``logprobs + 1`` entries): see
    :func:`_top_logprobs`.
    """
    if result.logprobs is None:
        return None
    entries = _emitted(result, tokenizer)
    if tokenizer is None:
        tokens = [str(t.token_id) for t in entries]
        return {"tokens": tokens, "token_logprobs": [t.logprob for t in entries],
                "top_logprobs": [{str(i): v for i, v in t.top} for t in entries],
                "text_offset": [sum(map(len, tokens[:k])) for k in range(len(tokens))]}

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)  # (as the target's decode: the returned text)

    pieces = token_pieces(decode, [t.token_id for t in entries], getattr(result, "text", None))
    return {"tokens": [p.text for p in pieces], "token_logprobs": [t.logprob for t in entries],
            "top_logprobs": [_top_logprobs(tokenizer, decode, t, p) for t, p in zip(entries, pieces)],
            "text_offset": [p.offset for p in pieces]}


def _top_logprobs(tokenizer: Any, decode: Any, entry: Any, piece: TokenPiece) -> dict[str, float]:
    """One position's alternatives keyed by their text, a distinct key for each token: the chosen token's key is its
    ``tokens`` entry; another token's is the text it would add in the chosen one's place, else its own text, else
    (a token holding part of a character, whose text is U+FFFD) its bytes as OpenAI's API spells them
    (``bytes:\\xf0\\x9f``), else ``token_id:N`` (vLLM's spelling)."""
    out: dict[str, float] = {}
    taken = {piece.text}
    for token, value in entry.top:
        if token == entry.token_id:
            out[piece.text] = value
            continue
        key = next(k for k in _spellings(tokenizer, decode, token, piece) if k not in taken)
        taken.add(key)
        out[key] = value
    out.setdefault(piece.text, entry.logprob)
    return out


def _spellings(tokenizer: Any, decode: Any, token: int, piece: TokenPiece) -> Any:
    """The keys ``token`` may take in a ``top_logprobs`` dict, the most readable first (see :func:`_top_logprobs`)."""
    window = decode([*piece.context, token])
    if "\ufffd" not in window[piece.shown:] and len(window) > piece.shown:
        yield window[piece.shown:]
    own = _piece(tokenizer, token)
    if own and "\ufffd" not in own:
        yield own
    yield "bytes:" + "".join(f"\\x{b:02x}" for b in _token_bytes(tokenizer, token, own))
    yield f"token_id:{token}"
