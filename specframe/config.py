"""Configuration as pydantic models, loadable from YAML; CLI flags override file values.

Example ``specframe.yaml``::

    model: smollm2-135m-instruct
    dtype: bfloat16
    max_new_tokens: 128
    sampling: {temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0}
    proposers:
      - name: ngram
        k: 8
        max_n: 4

Each proposer's own options are validated by its plugin's config model once plugins are loaded
(:func:`resolve_proposers`), so an unknown name lists the installed proposers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .contracts import ProposerConfig
from .errors import ConfigError


class SamplingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0, description="0 = greedy; > 0 samples (speculative sampling).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus filter, in (0, 1]; 1 = off.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 = off.")
    seed: int = Field(0, ge=0, lt=2**63, description="Seed of the per-request torch.Generator, in [0, 2**63).")


class IsolationConfig(BaseModel):
    """How a faulty proposer is treated (see :mod:`specframe.isolation`); output never depends on it."""

    model_config = ConfigDict(extra="forbid")

    propose_timeout_s: float | None = Field(
        5.0, gt=0, description="A propose call slower than this many seconds is a fault (its draft is dropped); null = no budget."
    )
    max_faults: int = Field(3, ge=1, description="Faults in one request after which the proposer is disabled for its rest.")


class SpecframeConfig(BaseModel):
    """Top-level configuration (file or Python API)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("smollm2-135m-instruct", description="Built-in model name, model directory or .gguf file.")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="auto = bfloat16 where the device supports it, else float32."
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where the target runs.")
    chat: bool = Field(True, description="Apply the tokenizer's chat template when it has one.")
    max_new_tokens: int = Field(128, ge=1, description="Tokens to generate per prompt at most.")
    stop: list[str] = Field(default_factory=list, description="Stop strings (cut from the text).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    verifier: str = Field("auto", description="auto = greedy at temperature 0, else speculative-sampling.")
    proposers: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "ngram"}],
        description="Proposer configs, each with `name` plus that proposer's own options.",
    )

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("stop strings must be non-empty (an empty string would stop at once)")
        return v

    @field_validator("proposers")
    @classmethod
    def _named(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, p in enumerate(v):
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise ValueError(f"proposers[{i}] must be a mapping with a `name`")
        return v


def _one_line(exc: ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {err['msg']}")
    return f"{where}: " + "; ".join(parts)


def load_config(path: str | Path | None = None, base: dict[str, Any] | None = None, **overrides: Any) -> SpecframeConfig:
    """Read a YAML config (optional) and apply overrides (None values are ignored; ``sampling`` merges).

    Raises:
        ConfigError: unreadable file, bad YAML, or a value out of range (message names the field).
    """
    data: dict[str, Any] = dict(base or {})
    where = "config"
    if path is not None:
        where = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{line}: invalid YAML") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of settings")
        data = loaded
    sampling = data.get("sampling") or {}
    if not isinstance(sampling, dict):  # dict() of a scalar or list would raise TypeError/ValueError (a traceback)
        raise ConfigError(f"{where}: sampling: must be a mapping (temperature, top_p, top_k, seed)")
    sampling = dict(sampling)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in SamplingConfig.model_fields:
            sampling[key] = value
        else:
            data[key] = value
    if sampling:
        data["sampling"] = sampling
    try:
        return SpecframeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, where)) from None


def resolve_proposers(config: SpecframeConfig, registry: Any) -> list[tuple[type, ProposerConfig]]:
    """Validate each proposer entry against its plugin's config model.

    Raises:
        UnknownProposerError: no installed plugin has that name (the message lists the installed ones).
        ConfigError: an option is unknown or out of range for that proposer.
    """
    out = []
    for entry in config.proposers:
        cls = registry.proposer(entry["name"])
        try:
            out.append((cls, cls.Config.model_validate(entry)))
        except ValidationError as exc:
            raise ConfigError(_one_line(exc, f"proposer {entry['name']!r}")) from None
    return out
