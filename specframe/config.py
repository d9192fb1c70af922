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
(:func:`resolve_plugins`, the one path from a config to plugin classes), so an unknown name lists the installed
proposers.

Several proposers are combined into one verification tree per step (see docs/combining.md)::

    proposers: [{name: ngram}, {name: draft-model}]
    merge: {name: priority, max_nodes: 24}        # or name: confidence; plus that policy's own options
    router: adaptive                              # or {name: adaptive, ...options}, or none

``merge`` and ``router`` are validated by their plugins' config models (:func:`resolve_plugins`); they only
matter with two or more proposers (a router may also trim a lone proposer's drafts to what pays on this
machine). An option no plugin declares is refused there (every plugin config forbids extra keys).

One form: :func:`load_config` returns the typed config, one frozen model over the installed plugins
(:func:`typed_config_model`: ``proposers`` a discriminated union by ``name``, so ``cfg.proposers`` are the
proposers' own config objects, ``cfg.merge`` / ``cfg.router`` the policy's and the router's). Every host holds
that form: the Python API (``sf.config``), the CLI, serve, bench, replay and the vLLM bridge. Reading a file takes
two checks inside :func:`load_config`: its own fields first (:class:`SpecframeConfig`: shorthands, ranges; no
plugin needed), then each plugin entry by its plugin's config (:func:`resolve_plugins`, so an unknown name lists
the installed ones). A request's overrides are applied to the typed config directly (:func:`resolve_plugins`'s
keywords). Configs are frozen: a change is a new config (``load_config(None, base=cfg.model_dump(exclude_unset=True),
...)``: the fields set so far stay set, the rest stay defaults, which :func:`resolve_plugins` tells apart). Its JSON
Schema, :func:`config_schema`, gives an editor (``specframe plugins --schema``). The shorthands are read once, by
:func:`read_shorthands`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

from .contracts import ProposerConfig
from .contracts.combining import MergePolicyConfig, RouterConfig, merge_key
from .contracts.constraint import ConstraintSpec
from .contracts.proposer import numbers_as_numbers
from .errors import ConfigError, ConstraintError, UnknownRouterError, first_line
from .io.yamlfile import read_yaml
from .sampling import check_max_new_tokens, check_seed, check_temperature, check_top_k, check_top_p

# torch threads at most: far above any machine's cores, far below what overflows torch.set_num_threads (int32)
MAX_THREADS = 1024

# each value type carries the bounds its check enforces into the JSON Schema (one source of truth: see config_schema)
Temperature = Annotated[float, BeforeValidator(check_temperature), WithJsonSchema({"type": "number", "minimum": 0})]
TopP = Annotated[float, BeforeValidator(check_top_p),
                 WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})]
TopK = Annotated[int, BeforeValidator(check_top_k), WithJsonSchema({"type": "integer", "minimum": 0})]
Seed = Annotated[int, BeforeValidator(check_seed),
                 WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1})]
MaxNewTokens = Annotated[int, BeforeValidator(check_max_new_tokens),
                         WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 2**63 - 1})]
Threads = Annotated[StrictInt | Literal["auto"], WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_THREADS}, {"const": "auto"}]})]
StopStrings = Annotated[list[str], WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1}})]


class SamplingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: Temperature = Field(0.0, description="0 = greedy (so is any value below 1e-5); above samples "
                                     "(speculative sampling).")
    top_p: TopP = Field(1.0, description="Nucleus filter, in (0, 1]; 1 = off.")
    top_k: TopK = Field(0, description="Keep the k most likely tokens; 0 = off.")
    seed: Seed = Field(0, description="Seed of the per-request torch.Generator, in [0, 2**63).")


def _stops(v: Any) -> list[str]:
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, (list, tuple)) or not all(isinstance(x, str) and x for x in stops):
        raise ValueError("must be a non-empty string or a list of them")
    return list(stops)


class RequestSettings(BaseModel):
    """One request's settings that override the config: ``Specframe.generate(...)`` keywords and the CLI's
    flags (None = the config's). Validated by the same rules as the config (:mod:`specframe.sampling`); see
    :func:`settings_error` for the message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: MaxNewTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    seed: Seed | None = None
    stop: Annotated[list[str], BeforeValidator(_stops)] | None = None


def settings_error(exc: ValidationError, names: dict[str, str] | None = None) -> str:
    """A :class:`RequestSettings` validation error as one line naming each value as its user spelled it
    (``names``: field -> spelling, e.g. ``{"temperature": "--temperature"}``; default: the field's name), e.g.
    ``temperature must be a number, got 'hot'``."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else "(top level)"
        name = (names or {}).get(field, field)
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{name} {msg}, got {err['input']!r}" if err["type"] == "value_error" else f"{name}: {msg}")
    return "; ".join(parts)


class IsolationConfig(BaseModel):
    """How a faulty proposer is treated (see :mod:`specframe.decode.isolation`); output never depends on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    propose_timeout_s: float | None = Field(
        5.0, gt=0, description="A propose call slower than this many seconds is a fault (its draft is dropped); null = no time limit."
    )
    max_faults: int = Field(3, ge=1, description="Faults in one request after which the proposer is disabled for its rest.")

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


class MergeSettings(BaseModel):
    """``merge:``: how combined proposers' drafts share one tree. Other keys are the policy's own options, checked
    against its config model once plugins are loaded (:func:`resolve_plugins`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field("priority", description="Merge policy (see `specframe plugins`): priority | confidence | ... "
                      "(`policy:` is read as `name:`)")
    max_nodes: int = Field(24, ge=1, le=256, description="Most nodes of the merged tree (the verification width).")

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


class RouterSettings(BaseModel):
    """``router:``: which combined proposers run each step. ``none`` = every proposer, every step. Other keys
    are the router's own options (:func:`resolve_plugins`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field("adaptive", description="Router (see `specframe plugins`), or none.")


def proposer_shorthand(v: Any) -> Any:
    """``"ngram"`` is short for ``{"name": "ngram"}`` (a list may mix both forms); anything else is left as it is."""
    if isinstance(v, str):
        v = [v]
    if isinstance(v, (list, tuple)):
        return [{"name": p} if isinstance(p, str) else p for p in v]
    return v


def router_shorthand(v: Any) -> Any:
    """``router: NAME`` is short for ``{name: NAME}``; ``null`` and ``false`` mean ``{name: none}`` (no router);
    anything else is left as it is."""
    if v is None or v is False:
        return {"name": "none"}
    return {"name": v} if isinstance(v, str) else v


def read_shorthands(data: Any) -> Any:
    """The one reading of a config's shorthands, for the runtime config (:class:`SpecframeConfig`), the typed model
    (:func:`typed_config_model`) and a request's overrides alike: ``proposers: ngram`` (:func:`proposer_shorthand`),
    ``merge: NAME`` and the old ``policy:`` key (:func:`~specframe.contracts.combining.merge_key`), ``router: NAME`` /
    ``none`` / ``null`` / ``false`` (:func:`router_shorthand`); a ``merge`` or ``router`` mapping without ``name``
    names the default one. A non-mapping is left for validation to refuse.

    Raises:
        ValueError: ``merge`` gives ``name`` and ``policy`` that disagree.
    """
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "proposers" in data:
        data["proposers"] = proposer_shorthand(data["proposers"])
    if "merge" in data:
        merge = {"name": data["merge"]} if isinstance(data["merge"], str) else merge_key(data["merge"])
        if isinstance(merge, dict):  # a mapping without `name`: the default policy's options
            merge = {"name": MergeSettings.model_fields["name"].default, **merge}
        data["merge"] = merge
    if "router" in data:
        router = router_shorthand(data["router"])
        if isinstance(router, dict):  # a mapping without `name`: the default router's options
            router = {"name": RouterSettings.model_fields["name"].default, **router}
        data["router"] = router
    return data


def names_no_router(router: Any) -> bool:
    """Whether ``router`` (after :func:`router_shorthand`) is ``{name: none}``."""
    name = router.get("name") if isinstance(router, dict) else getattr(router, "name", None)
    return name == "none"


class LlamaCppSettings(BaseModel):
    """Options of the llama.cpp engine (``engine: llama.cpp``; docs/llamacpp.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_ctx: Optional[int] = Field(None, ge=16, le=1 << 20, description="KV cells per request (default: the model's "
                                 "training context, at most 8192).")
    trees: bool = Field(False, description="Verify token trees in one batch (several sequence ids); not bit-exact "
                        "on llama.cpp, so off: tree proposers' drafts keep their leading chain.")
    weights: Literal["gguf", "auto", "bf16", "f16", "q8_0", "q4_0"] = Field(
        "gguf", description="The tensor types llama.cpp runs: gguf = the file's own; bf16 / f16 / q8_0 / q4_0 = the "
        "file requantized once into the model cache (kernels that read a weight once for many rows: the wide forward; "
        "quality measured in docs/llamacpp.md); auto = whichever of gguf, bf16 and q8_0 costs least per token on this "
        "machine's measured T(n).")
    inexact: bool = Field(False, description="Run where llama.cpp's k-token batches round differently from one-token "
                          "decoding (a build with llamafile / repack kernels, or a model whose kernels depend on the "
                          "batch size; checked at load): output may then diverge from llama.cpp decoding alone.")

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


def _device_name(v: Any) -> Any:
    """The ``device`` field's check: cpu, cuda or cuda:N (whether that GPU exists is checked at load)."""
    index = v[5:] if isinstance(v, str) and v.startswith("cuda:") else None
    if v not in ("cpu", "cuda") and not (index and index.isascii() and index.isdigit()):
        raise ValueError(f"device must be cpu, cuda or cuda:N (N a GPU index, e.g. cuda:1), got {v!r}")
    return v


class SpecframeConfig(BaseModel):
    """A config file's own fields, checked before plugins are loaded (plugin entries are mappings here): the first
    check of :func:`load_config` and the fields :func:`typed_config_model` is built from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("smollm2-135m-instruct", description="Built-in model name, model directory or .gguf file.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto = the fastest measured on this machine (profile: `specframe tune`); on CUDA bf16 "
        "where the GPU computes it natively (compute capability 8.0+), else float16."
    )
    device: Annotated[str, BeforeValidator(_device_name)] = Field(
        "cpu", description="Where the target runs: cpu, cuda (the current GPU) or cuda:N (GPU N).")
    engine: Literal["transformers", "llama.cpp"] = Field(
        "transformers", description="What runs the target: transformers (any HF model; the exactness reference) or "
        "llama.cpp (a GGUF on llama.cpp's CPU kernels; docs/llamacpp.md).")
    llamacpp: LlamaCppSettings = Field(default_factory=LlamaCppSettings, description="llama.cpp engine options.")
    threads: Threads = Field(
        "auto", description="torch threads; auto = the fastest measured count that fits in the cores other "
        "processes leave free, re-checked during a run (docs/machine.md); at most 1024.")
    prepack: bool | Literal["auto"] = Field(
        "auto", description="Pre-pack linear weights for oneDNN (CPU); auto = where the machine profile measured it faster.")
    chat: bool = Field(True, description="Apply the tokenizer's chat template when it has one.")
    batch_size: int = Field(1, ge=1, le=256, description="Requests decoded together, one target forward per step, "
                            "when several threads generate at once (1: each request its own forwards; docs/batching.md).")
    max_new_tokens: MaxNewTokens = Field(128, description="Tokens to generate per prompt at most.")
    stop: StopStrings = Field(default_factory=list, description="Stop strings (cut from the text).")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    verifier: str = Field("auto", description="auto = greedy at temperature 0, else speculative-sampling.")
    constraint: Optional[ConstraintSpec] = Field(
        None, description="Structured output for every request: one of json_schema (a JSON Schema), json_object: "
        "true (any JSON object), regex, grammar (Lark); requests may override it (docs/structured-output.md).")
    constraint_engine: str = Field("llguidance", description="The constraint engine plugin that compiles constraints.")
    proposers: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"name": "ngram"}],
        description="Proposer configs, each with `name` plus that proposer's own options; two or more are combined.",
    )
    merge: MergeSettings = Field(default_factory=MergeSettings, description="Combining proposers: the merge policy.")
    router: RouterSettings = Field(default_factory=RouterSettings, description="Combining proposers: the router.")

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        return read_shorthands(data)

    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))

    @field_validator("router", mode="before")
    @classmethod
    def _router_mapping(cls, v: Any) -> Any:
        if not isinstance(v, (dict, RouterSettings)):
            raise ValueError("give a router name (`adaptive`, or `none` for no router) or {name: ..., options}")
        return v

    @field_validator("threads")
    @classmethod
    def _threads(cls, v: Any) -> Any:
        if v != "auto" and not 1 <= v <= MAX_THREADS:
            raise ValueError(f"threads must be in [1, {MAX_THREADS}] or auto")
        return v

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
        if not v:
            raise ValueError("give at least one proposer (`none` decodes without drafts)")
        return v


def validation_line(exc: ValidationError, where: str | None = None) -> str:
    """A validation error as one line: ``where: field.path: message; ...`` (``where`` left out when None)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return ("" if where is None else f"{where}: ") + "; ".join(parts)


def load_config(path: str | Path | None = None, base: dict[str, Any] | None = None, *, registry: Any = None,
                **overrides: Any) -> BaseModel:
    """The config a run uses: a YAML file (optional) or ``base`` (a mapping of fields), ``overrides`` applied over it
    (None values are ignored; ``sampling`` merges), checked against the installed plugins.

    Returns an instance of :func:`typed_config_model` for ``registry`` (default: a fresh
    :func:`~specframe.registry.build_registry`): ``proposers`` is a tuple of the proposers' own config objects (e.g.
    ``NgramConfig``), ``merge`` the merge policy's and ``router`` the router's (None: no router). The file's own
    fields are read first by :class:`SpecframeConfig` (shorthands, ranges: no plugin needed), each plugin entry then
    by its plugin's config (:func:`runtime_config`); no caller holds the file form. A typed config's
    ``model_dump(exclude_unset=True)`` is a valid ``base`` (how a loaded config takes more overrides).

    Raises:
        ConfigError: unreadable file, not UTF-8, bad YAML, a key given twice, a value out of range or a bad plugin
            option (message names the file and the field).
        ConstraintError: the constraint engine refuses ``constraint`` with no model at hand (invalid, unsupported,
            or admitting no output: the engine's ``check``, where it has one); a schema nested deeper than
            ``MAX_SCHEMA_DEPTH`` is a ConfigError with the other fields.
        UnknownProposerError / UnknownMergePolicyError / UnknownRouterError: a name no installed plugin provides.
    """
    if registry is None:
        from .registry import build_registry

        registry = build_registry()
    fields = _file_fields(path, base, overrides)
    if fields.constraint is not None:
        _check_constraint(fields, registry, "config" if path is None else str(path))
    return runtime_config(fields, registry)


def _check_constraint(config: SpecframeConfig, registry: Any, where: str) -> None:
    """The config's ``constraint`` through its engine's ``check`` (when it has one): a constraint no model could
    decode under fails as the config loads, not at the first request.

    Raises:
        ConstraintError: its message, after ``where: constraint:``.
        UnknownConstraintEngineError: ``constraint_engine`` names no installed engine.
    """
    check = getattr(registry.constraint_engine(config.constraint_engine), "check", None)
    if check is None:
        return
    try:
        check(config.constraint)
    except ConstraintError as exc:
        raise ConstraintError(f"{where}: constraint: {first_line(exc)}") from None


def _file_fields(path: str | Path | None, base: dict[str, Any] | None, overrides: dict[str, Any]) -> SpecframeConfig:
    """The first check of :func:`load_config`: the file's own fields (plugin entries still mappings).

    Raises:
        ConfigError: as :func:`load_config`, less the plugins' names and options.
    """
    data: dict[str, Any] = dict(base or {})
    where = "config"
    if path is not None:
        where = str(path)
        loaded = read_yaml(path, "config file")
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
        raise ConfigError(validation_line(exc, where)) from None


@dataclass(frozen=True)
class Plugins:
    """A config's plugins, resolved: each class with its validated config (instances are built per request)."""

    proposers: tuple[tuple[type, ProposerConfig], ...]  # in the configured order (provenance order)
    merge: tuple[type, MergePolicyConfig] | None  # None: one proposer and ``merge`` left at its default
    router: tuple[type, RouterConfig] | None  # None: ``router: none``, or not needed (see resolve_plugins)


def resolve_plugins(config: Any, registry: Any, *, proposers: Any = None, merge: Any = None, router: Any = None,
                    lone_router: bool = False) -> Plugins:
    """The one path from a config to plugin classes, used by the Python API, the CLI, bench, replay, training, the
    vLLM bridge and each request alike.

    ``config`` is the typed config (:func:`load_config`, ``sf.config``: entries are the plugins' own config
    objects, used as they are) or, inside :func:`load_config`, a :class:`SpecframeConfig` (entries are mappings,
    checked here). ``proposers`` / ``merge`` / ``router`` are one request's overrides, read as
    a config file's values are (shorthands included); None keeps the config's. Nothing else of ``config`` is
    copied or re-validated.

    Proposers are always resolved. ``merge`` and ``router`` act when two or more proposers are combined; with one
    proposer they are resolved when set explicitly (a typo fails now, not on the day a second proposer is added),
    and the router also with ``lone_router`` (a lone proposer routed on this machine's cost curve), where a
    default router that is not installed just means no router.

    Raises:
        UnknownProposerError / UnknownMergePolicyError / UnknownRouterError: no installed plugin has that name
            (the message lists the installed ones).
        DuplicateRegistrationError: two installed plugins register that name.
        ConfigError: an option unknown or out of range for its plugin, or the same proposer twice with the same
            options.
    """
    given = _overrides(proposers, merge, router)
    explicit = config.model_fields_set | set(given)
    entries = given.get("proposers", config.proposers)
    found = tuple(_resolve_proposers(entries, registry))
    combined = len(found) > 1
    merge_entry = given.get("merge", config.merge if "merge" in config.model_fields_set else MergeSettings())
    resolved_merge = _resolve_merge(merge_entry, registry) if combined or "merge" in explicit else None
    # a typed config's router None is `router: none` when set; unset, the default router is meant
    router_entry = given.get("router", config.router if "router" in config.model_fields_set else RouterSettings())
    resolved_router = None
    if combined or "router" in explicit:
        resolved_router = _resolve_router(router_entry, registry)
    elif lone_router:
        try:
            resolved_router = _resolve_router(router_entry, registry)
        except UnknownRouterError:
            resolved_router = None
    return Plugins(found, resolved_merge, resolved_router)


def _overrides(proposers: Any, merge: Any, router: Any) -> dict[str, Any]:
    """A request's plugin overrides read as a config file reads them (shorthands, names, bounds of ``merge``), only
    the ones given: ``{"proposers": [...], "merge": MergeSettings, "router": RouterSettings}``.

    Raises:
        ConfigError: a malformed override (the message names the field).
    """
    data = {k: v for k, v in (("proposers", proposers), ("merge", merge), ("router", router)) if v is not None}
    if not data:
        return {}
    try:
        read = SpecframeConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc)) from None
    return {k: getattr(read, k) for k in data}


def _plugin_config(cls: type, entry: Any, where: str) -> Any:
    """``entry`` as ``cls.Config``: a typed config's own object as it is, a mapping (or another model) validated.

    Raises:
        ConfigError: an option unknown or out of range for that plugin (the message names ``where``).
    """
    if type(entry) is cls.Config:
        return entry
    if isinstance(entry, cls.Config):  # a typed config's member (the plugin's Config with `name` fixed): as its own
        values = {k: getattr(entry, k) for k in cls.Config.model_fields}
        return cls.Config.model_construct(entry.model_fields_set, **values)
    data = entry.model_dump() if isinstance(entry, BaseModel) else entry
    try:
        return cls.Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc, where)) from None


def _resolve_proposers(entries: Any, registry: Any) -> list[tuple[type, ProposerConfig]]:
    """Validate each proposer entry (a mapping, or a typed config's object) against its plugin's config model.

    Raises:
        UnknownProposerError: no installed plugin has that name (the message lists the installed ones).
        DuplicateRegistrationError: two installed plugins register that name (the message names both).
        ConfigError: an option is unknown or out of range for that proposer, or two entries are the same
            proposer with the same options.
    """
    out: list[tuple[type, ProposerConfig]] = []
    for i, entry in enumerate(entries):
        name = entry.name if isinstance(entry, BaseModel) else entry["name"]
        cls = registry.proposer(name)
        pcfg = _plugin_config(cls, entry, f"proposer {name!r}")
        same = next((k for k, (c, other) in enumerate(out) if c is cls and other == pcfg), None)
        if same is not None:
            raise ConfigError(
                f"proposers[{i}] repeats proposers[{same}] ({name!r} with the same options): combining a "
                "proposer with itself adds nothing; drop one or give them different options"
            )
        out.append((cls, pcfg))
    return out


def _resolve_merge(settings: MergeSettings | dict[str, Any], registry: Any) -> tuple[type, MergePolicyConfig]:
    """Validate ``merge:`` against its policy's config model.

    Raises:
        UnknownMergePolicyError: no installed plugin provides that policy (the message lists the installed ones).
        ConfigError: an option is unknown or out of range for that policy.
    """
    if isinstance(settings, MergePolicyConfig):  # a typed config's own
        cls = registry.merge_policy(settings.name)
        return cls, _plugin_config(cls, settings, f"merge policy {settings.name!r}")
    data = settings.model_dump() if isinstance(settings, BaseModel) else dict(settings)
    data.setdefault("name", "priority")
    cls = registry.merge_policy(data["name"])
    return cls, _plugin_config(cls, data, f"merge policy {data['name']!r}")


def _resolve_router(settings: RouterSettings | dict[str, Any] | str | None, registry: Any) -> tuple[type, RouterConfig] | None:
    """Validate ``router:`` against its router's config model; None for ``router: none``.

    Raises:
        UnknownRouterError: no installed plugin provides that router (the message lists the installed ones).
        ConfigError: an option is unknown or out of range for that router.
    """
    if isinstance(settings, RouterConfig):  # a typed config's own
        cls = registry.router(settings.name)
        return cls, _plugin_config(cls, settings, f"router {settings.name!r}")
    settings = router_shorthand(settings)  # (a typed config's None: no router)
    data: dict[str, Any] = settings.model_dump() if isinstance(settings, BaseModel) else dict(settings)
    data.setdefault("name", "adaptive")
    if names_no_router(data):
        if len(data) > 1:
            raise ConfigError(f"router: none takes no options, got {sorted(k for k in data if k != 'name')}")
        return None
    cls = registry.router(data["name"])
    return cls, _plugin_config(cls, data, f"router {data['name']!r}")


def runtime_config(config: SpecframeConfig, registry: Any) -> BaseModel:
    """The typed config of ``config`` (the second check of :func:`load_config`; what a loaded
    :class:`~specframe.api.Specframe` runs with, ``sf.config``): an instance of :func:`typed_config_model` for
    ``registry``, whose ``proposers`` are the proposers' own config objects (e.g.
    ``NgramConfig``), ``merge`` the merge policy's and ``router`` the router's (None: ``router: none``, or the
    default router is not installed).

    ``config`` is checked by :func:`resolve_plugins` first, so a bad name or option gives the error every path gives;
    the fields ``config`` sets are the ones the typed config sets (``model_fields_set``: whether ``merge`` /
    ``router`` were set explicitly is kept).

    Raises:
        UnknownProposerError / UnknownMergePolicyError / UnknownRouterError, ConfigError: as :func:`resolve_plugins`.
    """
    plugins = resolve_plugins(config, registry)
    data = config.model_dump(exclude_unset=True)
    data["proposers"] = [c.model_dump() for _, c in plugins.proposers] if "proposers" in data else None
    if data["proposers"] is None:
        del data["proposers"]
    if "merge" in data:
        data["merge"] = plugins.merge[1].model_dump() if plugins.merge is not None else data["merge"]
    if "router" in data:
        data["router"] = None if plugins.router is None else plugins.router[1].model_dump()
    try:
        return typed_config_model(registry).model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc, "config")) from None


# --- the typed form: one frozen model over the installed plugins, and its JSON Schema ---------------------------


def _tagged(classes: dict[str, type]) -> Any:
    """A discriminated union (by ``name``) of each class's ``Config``, with ``name`` fixed to its registered name
    (a plugin whose config types ``name`` as a plain ``str`` gets a subclass with the literal here; one that types
    it ``Literal[name]`` is used as it is, so a typed config holds its own objects)."""
    titles = [cls.Config.__name__ for cls in classes.values()]

    def title(name: str, cls: type) -> str:  # the config class's own name, unless two plugins share it
        return cls.Config.__name__ if titles.count(cls.Config.__name__) == 1 else f"{cls.Config.__name__}_{name}"

    def member(name: str, cls: type) -> type:  # the plugin's own Config where it already types `name` so
        field = cls.Config.model_fields.get("name")
        if field is not None and field.annotation == Literal[name] and field.default == name:
            return cls.Config
        return create_model(title(name, cls), __base__=cls.Config, name=(Literal[name], name))

    members = [member(name, cls) for name, cls in sorted(classes.items())]
    if not members:
        return dict[str, Any]
    if len(members) == 1:
        return members[0]
    return Annotated[Union[tuple(members)], Field(discriminator="name")]


def typed_config_model(registry: Any) -> type[BaseModel]:
    """The frozen config model of ``registry``'s plugins (a :class:`~specframe.registry.Registry`); one class per set
    of plugin classes (registries with the same plugins give the same model, so their configs compare equal).

    Its instances have ``proposers`` as a tuple of the proposers' own config objects (e.g. ``NgramConfig``),
    ``merge`` as the merge policy's and ``router`` as the router's config object (None for ``router: none``); the
    shorthands of a config file (``proposers: ngram``, ``router: none``, ``merge: confidence``, ``policy:``) are read
    as :class:`~specframe.config.SpecframeConfig` reads them.
    """
    return _typed_model(*(tuple(sorted(classes.items())) for classes in (
        registry.proposers, registry.merge_policies, registry.routers)))


@lru_cache(maxsize=16)
def _typed_model(proposers: tuple, merge_policies: tuple, routers: tuple) -> type[BaseModel]:
    """:func:`typed_config_model` of these ``(name, plugin class)`` pairs."""
    proposer = _tagged(dict(proposers))
    merge = _tagged(dict(merge_policies))
    router = _tagged(dict(routers))
    names = {"merge": dict(merge_policies), "router": dict(routers)}
    base = SpecframeConfig.model_fields
    fields: dict[str, Any] = {name: (f.annotation, f) for name, f in base.items()
                              if name not in ("proposers", "merge", "router")}
    fields["proposers"] = (tuple[proposer, ...], Field(default=({"name": "ngram"},), min_length=1,
                                                       description=base["proposers"].description))
    # the defaults are the runtime config's where installed; else none (SPECFRAME_PLUGINS may leave them out)
    default_merge = base["merge"].default_factory().name
    default_router = base["router"].default_factory().name
    if default_merge in names["merge"]:
        fields["merge"] = (merge, Field(default={"name": default_merge}, description=base["merge"].description))
    else:
        fields["merge"] = (Optional[merge], Field(default=None, description=base["merge"].description))
    fields["router"] = (Optional[router], Field(default={"name": default_router} if default_router in names["router"]
                                                else None, description=base["router"].description))
    return create_model("TypedSpecframeConfig", __base__=_Shorthands, **fields)


class _Shorthands(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _shorthands(cls, data: Any) -> Any:
        data = read_shorthands(data)
        if isinstance(data, dict) and "router" in data and names_no_router(data["router"]):
            data["router"] = None  # the typed form of no router
        return data


def config_schema(registry: Any) -> dict[str, Any]:
    """The JSON Schema of a ``specframe.yaml`` with the installed plugins' options (draft 2020-12, by pydantic)."""
    schema = typed_config_model(registry).model_json_schema()
    schema["title"] = "specframe config"
    props = schema["properties"]
    # the shorthands the loader reads (_Shorthands): a proposer, merge policy or router by its name alone
    def names(classes, *more):
        return {"enum": sorted(classes) + list(more)}
    item = props["proposers"].pop("items")
    props["proposers"] = {k: v for k, v in props["proposers"].items() if k in ("default", "description", "title")}
    props["proposers"]["anyOf"] = [names(registry.proposers), {"type": "array", "minItems": 1, "items": {
        "anyOf": [names(registry.proposers), item]}}]
    merge = {k: props["merge"].pop(k) for k in ("oneOf", "discriminator", "$ref", "anyOf") if k in props["merge"]}
    props["merge"]["anyOf"] = [names(registry.merge_policies), merge]
    router = props["router"].pop("anyOf")
    props["router"]["anyOf"] = [names(registry.routers, "none"), {"const": False}, {
        "type": "object", "properties": {"name": {"const": "none"}}, "required": ["name"],
        "additionalProperties": False}, *router]
    return schema
