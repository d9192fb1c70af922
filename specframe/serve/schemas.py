"""The OpenAI request bodies ``specframe serve`` accepts (pydantic, unknown fields refused), and specframe's own
``speculative`` field: the strategy of one request.

Fields follow the OpenAI API reference (completions and chat completions). Accepted but without effect where
specframe has nothing to do for them: ``user``, ``n: 1``, ``frequency_penalty`` / ``presence_penalty`` of 0;
anything else they take is refused with a 400 that names the field. Structured output (``response_format``,
``tools`` / ``tool_choice``) and ``logprobs`` are read by :mod:`specframe.serve.structured`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..contracts.constraint import MAX_SCHEMA_DEPTH, TOOL_WRAP_DEPTH, check_schema_depth, schema_depth


def _unicode_text(v: Any) -> Any:
    """``v`` (a string, or strings in a list) unchanged, if it is text: a lone UTF-16 surrogate (``"\\ud800"`` in
    JSON) is not, and no tokenizer can encode it."""
    for text in ([v] if isinstance(v, str) else v if isinstance(v, list) else []):
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = text[exc.start]
                raise ValueError(f"holds a lone UTF-16 surrogate (\\u{ord(bad):04x} at character {exc.start}), "
                                 "which is not text: send valid Unicode") from None
    return v


class Speculative(BaseModel):
    """``"speculative": {...}`` in a request body: which proposers draft for this request (names or configs, as in
    specframe's config file), and for two or more the merge policy and router."""

    model_config = ConfigDict(extra="forbid")

    proposers: list[Union[str, dict[str, Any]]] = Field(min_length=1)
    merge: Optional[Union[str, dict[str, Any]]] = None
    router: Optional[Union[str, dict[str, Any]]] = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = True


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the answer must follow (``strict`` is accepted either way: the
    schema is always enforced in full)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: Optional[bool] = None

    @field_validator("schema_", mode="before")
    @classmethod
    def _not_too_deep(cls, v: Any) -> Any:  # (before anything serialises it: a 400 naming the limit)
        check_schema_depth(v, "the schema", MAX_SCHEMA_DEPTH)
        return v


class ResponseFormat(BaseModel):
    """``response_format``: ``{"type": "text"}``, ``{"type": "json_object"}`` (JSON mode) or ``{"type":
    "json_schema", "json_schema": {...}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> Any:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given exactly when type is json_schema")
        return self


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: Optional[bool] = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _not_too_deep(cls, v: Any) -> Any:  # (before the chat template renders it; a tool call's schema wraps it)
        check_schema_depth(v, "the parameters schema", MAX_SCHEMA_DEPTH - TOOL_WRAP_DEPTH,
                           f"MAX_SCHEMA_DEPTH {MAX_SCHEMA_DEPTH}, less the {TOOL_WRAP_DEPTH} levels a tool call's "
                           "schema wraps it in")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=-1)  # -1: off, as vLLM reads it (specframe's 0)
    seed: Optional[int] = Field(None, ge=0)
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Literal[1] = 1
    user: Optional[str] = None
    frequency_penalty: Literal[0, 0.0] = 0
    presence_penalty: Literal[0, 0.0] = 0
    response_format: Optional[ResponseFormat] = None
    speculative: Optional[Speculative] = None

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, v: Any) -> Any:
        return 0 if v == -1 else v

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> Any:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> Any:
        _unicode_text(v)
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(s == "" for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @property
    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is text or a list of token ids (one prompt: ``n`` and batches of prompts
    are one request each)."""

    prompt: Union[str, list[int]]
    echo: Literal[False] = False
    logprobs: Optional[int] = Field(None, ge=0, le=20)  # the chosen token's and this many alternatives'

    @field_validator("logprobs", mode="before")
    @classmethod
    def _count_not_flag(cls, v: Any) -> Any:
        if isinstance(v, bool):  # (the chat API's flag; here the number of alternatives)
            raise ValueError("on /v1/completions logprobs is the number of alternatives per token (0-20), not true/false")
        return v

    @property
    def top_logprobs_n(self) -> Optional[int]:
        """Alternatives per token to return (None: no log-probabilities)."""
        return self.logprobs

    _prompt_text = field_validator("prompt")(classmethod(lambda cls, v: _unicode_text(v)))

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        # OpenAI's prompt may be a list of strings (a batch); a list of one is that prompt, more are refused here
        if isinstance(v, list) and v and all(isinstance(p, str) for p in v):
            if len(v) > 1:
                raise ValueError(f"a batch of {len(v)} prompts in one request is not served here: send one prompt per "
                                 "request (they are decoded together in the server's batch)")
            return v[0]
        return v


class TextPart(BaseModel):
    """One part of a message's content in the list form (``[{"type": "text", "text": "..."}]``): text parts only."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str

    _text = field_validator("text")(classmethod(lambda cls, v: _unicode_text(v)))


class Message(BaseModel):
    """A chat message. ``content`` is text or a list of text parts (joined, as OpenAI's API reads them); the role
    ``developer`` (OpenAI's newer name for the system message) is read as ``system``."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant message's earlier tool calls
    tool_call_id: Optional[str] = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _content_or_calls(self) -> Any:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant message with tool_calls may "
                             "leave it out)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    _content_text = field_validator("content", "name")(classmethod(lambda cls, v: _unicode_text(v)))

    @field_validator("tool_calls", mode="before")
    @classmethod
    def _calls_not_too_deep(cls, v: Any) -> Any:  # (the chat template's message walk recurses: refused before it)
        depth = schema_depth(v)
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"nest {depth} levels of JSON objects and arrays; at most {MAX_SCHEMA_DEPTH} are read "
                             "(specframe.contracts.constraint.MAX_SCHEMA_DEPTH)")
        return v

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v: Any) -> Any:
        if isinstance(v, list):
            kinds = sorted({str(p.get("type")) for p in v if isinstance(p, dict)} - {"text"})
            if kinds:
                raise ValueError(f"this model reads text only: content parts of type {', '.join(kinds)} cannot be used")
        return v

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template takes it: role (``developer`` as ``system``), text content, name."""
        text = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": text or ""}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def unanswered_tool_message(messages: list[Message]) -> Optional[tuple[str, str]]:
    """``(message, param)`` for the first ``tool`` message that answers no call, as OpenAI refuses it: one that
    follows no assistant message with ``tool_calls`` (other tool messages between them aside), or whose
    ``tool_call_id`` is none of that message's calls' ids; None when every tool message answers a call."""
    calls: Optional[set[str]] = None  # the ids of the calls the next tool messages may answer (None: no call)
    for i, m in enumerate(messages):
        if m.role != "tool":
            calls = None if m.role != "assistant" or not m.tool_calls else \
                {c["id"] for c in m.tool_calls if isinstance(c.get("id"), str)}
        elif calls is None:
            return ("messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
                    f"messages.[{i}].role")
        elif calls and m.tool_call_id not in calls:
            return (f"tool_call_id {m.tool_call_id!r} answers none of the preceding message's tool_calls "
                    f"({', '.join(sorted(calls))})", f"messages.[{i}].tool_call_id")
    return None


class ChatRequest(_Common):
    """``POST /v1/chat/completions``: the messages go through the model's chat template."""

    messages: list[Message] = Field(min_length=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[Tool]] = Field(None, min_length=1)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = None

    @model_validator(mode="after")
    def _tools_and_logprobs(self) -> Any:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools")
        names = [t.function.name for t in self.tools or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tool names must differ: {', '.join(twice)} is given more than once")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tools and \
                self.tool_choice.function.name not in {t.function.name for t in self.tools}:
            raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools")
        return self

    @property
    def top_logprobs_n(self) -> Optional[int]:
        """Alternatives per token to return (None: no log-probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None
