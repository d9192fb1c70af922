"""The shape of a trace's ``manifest.json`` and ``tokens.json.gz`` (see :mod:`specframe.replay.trace`), checked once
when a trace is read, so that a field of the wrong type (``"files": []``, a string where a count belongs, a token id
outside the vocabulary) is one :class:`~specframe.errors.TraceError` naming the file and the field — never an
AttributeError deep inside replay. Types are strict (no ``"3"`` for 3, no ``true`` for 1); unknown extra fields are
kept (a newer specframe may add some)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from ..config import validation_line
from ..errors import TraceError


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class FileMeta(_Part):
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class TargetMeta(_Part):
    vocab_size: int = Field(ge=1)
    eos_token_ids: list[int]
    max_context: int = Field(ge=2)
    supports_trees: bool
    hidden_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)


class QuestionMeta(_Part):
    question_id: Any = None
    category: str | None = None
    prompt_tokens: int = Field(ge=1)
    new_tokens: int = Field(ge=0)
    finish_reason: Literal["stop", "length"]


class StrategyEntry(_Part):
    name: str


class CostMeta(_Part):
    t_ms: dict[str, list[float]]

    @field_validator("t_ms")
    @classmethod
    def _contexts(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        for ctx, times in v.items():
            if not ctx.isdigit() or not times or not all(t > 0 for t in times):
                raise ValueError("must map each context length to a non-empty list of positive milliseconds")
        return v


class FeaturesMeta(_Part):
    layers: dict[str, Literal["all", "last"]]

    @field_validator("layers")
    @classmethod
    def _layer_numbers(cls, v: dict[str, str]) -> dict[str, str]:
        if not all(k.isdigit() for k in v):
            raise ValueError("keys must be layer numbers")
        return v


class Manifest(_Part):
    format: str
    version: int
    model: str
    dtype: Literal["float32", "bfloat16", "float16"]
    specframe: str
    max_new_tokens: int = Field(ge=1)
    chat: bool
    recorded_with: list[StrategyEntry] = Field(min_length=1)
    target: TargetMeta
    questions: list[QuestionMeta]
    files: dict[str, FileMeta]
    cost: CostMeta | None = None
    features: FeaturesMeta | None = None
    entropy: EntropyMeta | None = None
    bytes_per_token: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _tokens_file(self) -> "Manifest":
        if "tokens.json.gz" not in self.files:
            raise ValueError("files must list tokens.json.gz")
        unknown = sorted(set(self.files) - {"tokens.json.gz", "features.safetensors"})
        if unknown:
            raise ValueError(f"files lists {unknown}: a trace holds only tokens.json.gz and features.safetensors")
        return self


class TokenEntry(_Part):
    prompt: list[int] = Field(min_length=1)
    generated: list[int]
    entropy: list[list[float]] | None = None  # [G][2] (H, M2) nats


class EntropyMeta(_Part):
    unit: Literal["nats"]


_TOKENS = TypeAdapter(list[TokenEntry])


def check_manifest(m: Any, where: str, fix: str) -> None:
    """Check a parsed manifest's shape.

    Raises:
        TraceError: ``<where>: <field.path>: <problem>; ...: <fix>`` on one line.
    """
    try:
        Manifest.model_validate(m)
    except ValidationError as exc:
        raise TraceError(f"{validation_line(exc, where)}: {fix}") from None


def check_tokens(payload: Any, vocab_size: int, where: str, fix: str) -> None:
    """Check the parsed ``tokens.json.gz``: a list of ``{"prompt": [ids], "generated": [ids]}`` with ids in
    ``[0, vocab_size)``.

    Raises:
        TraceError: naming the request and the field, on one line.
    """
    try:
        entries = _TOKENS.validate_python(payload)
    except ValidationError as exc:
        raise TraceError(f"{validation_line(exc, where)}: {fix}") from None
    for i, e in enumerate(entries):
        bad = next((t for t in e.prompt + e.generated if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise TraceError(f"{where}: request {i}: token id {bad} is outside the vocabulary [0, {vocab_size}): {fix}")
