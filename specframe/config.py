"""The config: one pydantic model, loadable from YAML; CLI flags and request keywords override its values.

Example ``specframe.yaml`` (docs/combining.md for several proposers)::

    model: smollm2-135m-instruct
    max_new_tokens: 128
    sampling: {temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0}
    proposers: [{name: ngram, k: 8}, {name: draft-model}]   # or `proposers: ngram`
    merge: {name: priority, max_nodes: 24}                    # or `merge: confidence`; plus the policy's options
    router: adaptive                                          # or {name: adaptive, ...options}, or none

:class:`SpecframeConfig` holds the fields, their checks and the shorthands (:func:`read_shorthands`) and needs no
plugin. :func:`typed_config_model` is that model over the installed plugins: ``proposers`` a union by ``name`` of
the plugins' own ``Config`` classes (each types ``name`` as a ``Literal``, checked at registration), ``merge`` /
``router`` the policy's and the router's (None: no router). :func:`load_config` checks the fields, then each plugin
entry through :func:`resolve_plugins` (the one path from a config to plugin classes: an unknown name lists the
installed ones), and returns the typed config every host holds (``sf.config``). Configs are frozen: a change is a
new config (``load_config(None, base=cfg.model_dump(exclude_unset=True), ...)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    create_model,
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
DEFAULT_MERGE, DEFAULT_ROUTER = "priority", "adaptive"

# each value type carries the bounds its check enforces into the JSON Schema (one source of truth: see config_schema)
Temperature = Annotated[float, BeforeValidator(check_temperature), WithJsonSchema({"type": "number", "minimum": 0})]
TopP = Annotated[float, BeforeValidator(check_top_p),
                 WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})]
TopK = Annotated[int, BeforeValidator(check_top_k), WithJsonSchema({"type": "integer", "minimum": 0})]
Seed = Annotated[int, BeforeValidator(check_seed),
                 WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1})]
MaxNewTokens = Annotated[int, BeforeValidator(check_max_new_tokens),
                         WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 2**63 - 1})]


def _threads(v: Any) -> Any:
    if v != "auto" and not 1 <= v <= MAX_THREADS:
        raise ValueError(f"threads must be in [1, {MAX_THREADS}] or auto")
    return v


def _non_empty(v: list[str]) -> list[str]:
    if any(s == "" for s in v):
        raise ValueError("stop strings must be non-empty (an empty string would stop at once)")
    return v


Threads = Annotated[StrictInt | Literal["auto"], AfterValidator(_threads), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_THREADS}, {"const": "auto"}]})]
StopStrings = Annotated[list[str], AfterValidator(_non_empty),
                        WithJsonSchema({"type": "array", "items": {"type": "string", "minLength": 1}})]


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


class MergeSettings(MergePolicyConfig):
    """``merge:`` with no plugin loaded: the base fields (``max_nodes``) plus the policy's own options, checked by
    its config model in :func:`resolve_plugins`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(DEFAULT_MERGE, description="Merge policy (see `specframe plugins`): priority | confidence | ... "
                      "(`policy:` is read as `name:`)")


class RouterSettings(RouterConfig):
    """``router:`` with no plugin loaded (``none`` = every proposer, every step), plus the router's own options."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(DEFAULT_ROUTER, description="Router (see `specframe plugins`), or none.")


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
    """The one reading of the shorthands (a file's and a request's overrides alike): ``proposers: ngram``, ``merge:
    NAME`` and its old ``policy:`` key (ValueError where they disagree), ``router: NAME`` / ``none`` / ``null`` /
    ``false``; a ``merge`` or ``router`` mapping without ``name`` names the default one."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if "proposers" in data:
        data["proposers"] = proposer_shorthand(data["proposers"])
    for key, default, shorthand in (("merge", DEFAULT_MERGE, merge_key), ("router", DEFAULT_ROUTER, router_shorthand)):
        if key in data:
            value = {"name": data[key]} if isinstance(data[key], str) else shorthand(data[key])
            data[key] = {"name": default, **value} if isinstance(value, dict) else value
    return data


def names_no_router(router: Any) -> bool:
    """Whether ``router`` (after :func:`router_shorthand`) is ``{name: none}``."""
    name = router.get("name") if isinstance(router, dict) else getattr(router, "name", None)
    return name == "none"


def _named(v: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, p in enumerate(v):
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            raise ValueError(f"proposers[{i}] must be a mapping with a `name`")
    if not v:
        raise ValueError("give at least one proposer (`none` decodes without drafts)")
    return v


def _router_mapping(v: Any) -> Any:
    if not isinstance(v, (dict, BaseModel)):
        raise ValueError("give a router name (`adaptive`, or `none` for no router) or {name: ..., options}")
    return v


def _no_router(v: Any) -> Any:
    """The typed config's ``router: none``: None."""
    if not (isinstance(v, dict) and names_no_router(v)):
        return v
    if len(v) > 1:
        raise ValueError(f"router: none takes no options, got {sorted(k for k in v if k != 'name')}")
    return None


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
    """The config's fields and their checks. As it is, it needs no plugin (plugin entries stay mappings, as a file
    gives them); :func:`typed_config_model` is this model with ``proposers`` / ``merge`` / ``router`` typed by the
    installed plugins."""

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
    proposers: Annotated[list[dict[str, Any]], AfterValidator(_named)] = Field(
        default_factory=lambda: [{"name": "ngram"}],
        description="Proposer configs, each with `name` plus that proposer's own options; two or more are combined.",
    )
    merge: MergeSettings = Field(default_factory=MergeSettings, description="Combining proposers: the merge policy.")
    router: Annotated[RouterSettings, BeforeValidator(_router_mapping)] = Field(
        default_factory=RouterSettings, description="Combining proposers: the router.")

    @classmethod
    def read(cls, data: Any, where: str | None = "config") -> SpecframeConfig:
        """``data`` validated; a failure is one :class:`ConfigError` line naming ``where`` and each field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(validation_line(exc, where)) from None

    @classmethod
    def read_overrides(cls, **given: Any) -> dict[str, Any]:
        """A request's plugin overrides (``proposers`` / ``merge`` / ``router``; None = not given) read as a file's
        values are (shorthands, names, the bounds of ``merge``), only those given: ``{"proposers": [...], "merge":
        MergeSettings, ...}``. Raises ConfigError naming the field."""
        data = {k: v for k, v in given.items() if v is not None}
        read = cls.read(data, None) if data else None
        return {k: getattr(read, k) for k in data}

    _shorthands = model_validator(mode="before")(classmethod(lambda cls, data: read_shorthands(data)))
    _numbers = model_validator(mode="before")(classmethod(numbers_as_numbers))


def validation_line(exc: ValidationError, where: str | None = None) -> str:
    """A validation error as one line: ``where: field.path: message; ...`` (``where`` left out when None)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return ("" if where is None else f"{where}: ") + "; ".join(parts)


def load_config(path: str | Path | None = None, base: dict[str, Any] | None = None, *, registry: Any = None,
                **overrides: Any) -> BaseModel:
    """The typed config (:func:`typed_config_model` for ``registry``, default a fresh
    :func:`~specframe.registry.build_registry`) of a YAML file or ``base`` (a mapping of fields; a typed config's
    ``model_dump(exclude_unset=True)`` is one), ``overrides`` applied over it (None values ignored; ``sampling``
    merges). The fields are checked first (no plugin needed), then each plugin entry (:func:`runtime_config`).

    Raises:
        ConfigError: unreadable file, not UTF-8, bad YAML, a key given twice, a value out of range or a bad plugin
            option (message names the file and the field).
        ConstraintError: the constraint engine's ``check`` refuses ``constraint`` (no model needed).
        UnknownProposerError / UnknownMergePolicyError / UnknownRouterError: a name no installed plugin provides.
    """
    if registry is None:
        from .registry import build_registry

        registry = build_registry()
    where = "config" if path is None else str(path)
    fields = SpecframeConfig.read(_file_data(path, base, overrides, where), where)
    if fields.constraint is not None:
        _check_constraint(fields, registry, where)
    return runtime_config(fields, registry)


def _check_constraint(config: SpecframeConfig, registry: Any, where: str) -> None:
    """``constraint`` through its engine's ``check`` (where it has one), so it fails as the config loads; a
    ConstraintError names ``where``."""
    check = getattr(registry.constraint_engine(config.constraint_engine), "check", None)
    if check is None:
        return
    try:
        check(config.constraint)
    except ConstraintError as exc:
        raise ConstraintError(f"{where}: constraint: {first_line(exc)}") from None


def _file_data(path: str | Path | None, base: dict[str, Any] | None, overrides: dict[str, Any], where: str) -> dict:
    """The file's (or ``base``'s) mapping with ``overrides`` applied; ConfigError for a bad file or ``sampling``."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        loaded = read_yaml(path, "config file")
        if not isinstance(loaded, (dict, type(None))):
            raise ConfigError(f"{path}: the top level must be a mapping of settings")
        data = loaded or {}
    sampling = data.get("sampling") or {}
    if not isinstance(sampling, dict):  # dict() of a scalar or list would raise TypeError/ValueError (a traceback)
        raise ConfigError(f"{where}: sampling: must be a mapping (temperature, top_p, top_k, seed)")
    sampling = dict(sampling)
    for key, value in overrides.items():
        if value is not None:
            (sampling if key in SamplingConfig.model_fields else data)[key] = value
    if sampling:
        data["sampling"] = sampling
    return data


@dataclass(frozen=True)
class Plugins:
    """A config's plugins, resolved: each class with its validated config (instances are built per request)."""

    proposers: tuple[tuple[type, ProposerConfig], ...]  # in the configured order (provenance order)
    merge: tuple[type, MergePolicyConfig] | None  # None: one proposer and ``merge`` left at its default
    router: tuple[type, RouterConfig] | None  # None: ``router: none``, or not needed (see resolve_plugins)


def resolve_plugins(config: Any, registry: Any, *, proposers: Any = None, merge: Any = None, router: Any = None,
                    lone_router: bool = False) -> Plugins:
    """The one path from a config to plugin classes (the Python API, the CLI, bench, replay, training, the vLLM
    bridge and each request alike). ``config``: the typed config (its entries used as they are) or a
    :class:`SpecframeConfig` (entries checked here); ``proposers`` / ``merge`` / ``router``: one request's overrides,
    read as a file's values are (:meth:`SpecframeConfig.read_overrides`; None keeps the config's).

    ``merge`` and ``router`` act when two or more proposers are combined; with one they are resolved when set
    explicitly (a typo fails now, not on the day a second proposer is added), and the router also with
    ``lone_router`` (a lone proposer routed on this machine's cost curve; the default router not installed: none).

    Raises:
        UnknownProposerError / UnknownMergePolicyError / UnknownRouterError: no installed plugin has that name
            (the message lists the installed ones); DuplicateRegistrationError: two plugins register it.
        ConfigError: an option unknown or out of range for its plugin, or the same proposer twice alike.
    """
    given = SpecframeConfig.read_overrides(proposers=proposers, merge=merge, router=router)
    explicit = config.model_fields_set | set(given)
    found = tuple(_resolve_proposers(given.get("proposers", config.proposers), registry))
    combined = len(found) > 1
    # unset, the default policy / router is meant (a typed config's router None is `router: none` when set)
    merge_entry = given.get("merge", config.merge if "merge" in config.model_fields_set else MergeSettings())
    resolved_merge = None
    if combined or "merge" in explicit:
        resolved_merge = _resolve_part("merge policy", registry.merge_policy, merge_entry, DEFAULT_MERGE)
    router_entry = given.get("router", config.router if "router" in config.model_fields_set else RouterSettings())
    resolved_router = None
    if combined or "router" in explicit or lone_router:
        try:
            resolved_router = _resolve_part("router", registry.router, router_entry, DEFAULT_ROUTER)
        except UnknownRouterError:
            if combined or "router" in explicit:
                raise
    return Plugins(found, resolved_merge, resolved_router)


def _plugin_config(cls: type, entry: Any, where: str) -> Any:
    """``entry`` as ``cls.Config``: a typed config's own object as it is (its ``name`` is a ``Literal``, checked at
    registration), a mapping or another model validated; ConfigError naming ``where`` for a bad option."""
    if isinstance(entry, cls.Config):
        return entry
    data = entry.model_dump() if isinstance(entry, BaseModel) else entry
    try:
        return cls.Config.model_validate({"name": cls.name, **data} if isinstance(data, dict) else data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc, where)) from None


def _resolve_proposers(entries: Any, registry: Any) -> list[tuple[type, ProposerConfig]]:
    """Each proposer entry (a mapping, or a typed config's object) as its plugin's config (raises as
    :func:`resolve_plugins`)."""
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


def _resolve_part(kind: str, lookup: Any, entry: Any, default: str) -> tuple[type, Any] | None:
    """``merge:`` or ``router:`` (a mapping, :class:`MergeSettings` / :class:`RouterSettings` or a typed config's own)
    as its plugin's config; None for no router (raises as :func:`resolve_plugins`)."""
    if kind == "router":
        entry = router_shorthand(entry.model_dump() if isinstance(entry, RouterSettings) else entry)
        try:
            entry = _no_router(entry)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if entry is None:
            return None
    name = entry.name if isinstance(entry, BaseModel) else entry.get("name", default)
    cls = lookup(name)
    return cls, _plugin_config(cls, entry, f"{kind} {name!r}")


def runtime_config(config: SpecframeConfig, registry: Any) -> BaseModel:
    """The typed config of ``config`` (``sf.config``: :func:`typed_config_model` for ``registry``) from the entries
    :func:`resolve_plugins` checked (so a bad name or option gives the error every path gives), with the fields
    ``config`` sets set (whether ``merge`` / ``router`` were set explicitly is kept); a typed config as it is."""
    if isinstance(config, _Typed):
        return config
    plugins = resolve_plugins(config, registry)
    data = config.model_dump(exclude_unset=True)
    if "proposers" in data:
        data["proposers"] = [c for _, c in plugins.proposers]
    if "merge" in data and plugins.merge is not None:
        data["merge"] = plugins.merge[1]
    if "router" in data:
        data["router"] = None if plugins.router is None else plugins.router[1]
    try:
        return typed_config_model(registry).model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_line(exc, "config")) from None


# --- the typed form: the model over the installed plugins, and its JSON Schema ----------------------------------


def _tagged(classes: dict[str, type]) -> Any:
    """A discriminated union (by ``name``) of each class's ``Config`` (each types ``name`` as ``Literal[its name]``,
    checked at registration, so a typed config holds the plugins' own objects)."""
    members = [cls.Config for _, cls in sorted(classes.items())]
    if not members:
        return dict[str, Any]
    if len(members) == 1:
        return members[0]
    return Annotated[Union[tuple(members)], Field(discriminator="name")]


def typed_config_model(registry: Any) -> type[SpecframeConfig]:
    """:class:`SpecframeConfig` over ``registry``'s plugins (a :class:`~specframe.registry.Registry`): ``proposers``
    a tuple of the proposers' own config objects (e.g. ``NgramConfig``), ``merge`` the merge policy's and ``router``
    the router's config object (None for ``router: none``); the same fields, checks and shorthands. One class per set
    of plugin classes (registries with the same plugins give the same model, so their configs compare equal)."""
    return _typed_model(*(tuple(sorted(classes.items())) for classes in (
        registry.proposers, registry.merge_policies, registry.routers)))


class _Typed(SpecframeConfig):
    model_config = ConfigDict(validate_default=True)


@lru_cache(maxsize=16)
def _typed_model(proposers: tuple, merge_policies: tuple, routers: tuple) -> type[SpecframeConfig]:
    """:func:`typed_config_model` of these ``(name, plugin class)`` pairs."""
    about = {name: SpecframeConfig.model_fields[name].description for name in ("proposers", "merge", "router")}
    merge, router = _tagged(dict(merge_policies)), _tagged(dict(routers))
    # the defaults are the file's where installed; else none (SPECFRAME_PLUGINS may leave them out)
    has_merge, has_router = DEFAULT_MERGE in dict(merge_policies), DEFAULT_ROUTER in dict(routers)
    return create_model(
        "TypedSpecframeConfig", __base__=_Typed,
        proposers=(tuple[_tagged(dict(proposers)), ...],
                   Field(default=({"name": "ngram"},), min_length=1, description=about["proposers"])),
        merge=(merge if has_merge else Optional[merge],
               Field(default={"name": DEFAULT_MERGE} if has_merge else None, description=about["merge"])),
        router=(Annotated[Optional[router], BeforeValidator(_no_router)],
                Field(default={"name": DEFAULT_ROUTER} if has_router else None, description=about["router"])))


def config_schema(registry: Any) -> dict[str, Any]:
    """The JSON Schema of a ``specframe.yaml`` with the installed plugins' options (draft 2020-12, by pydantic)."""
    schema = typed_config_model(registry).model_json_schema()
    schema["title"] = "specframe config"
    props = schema["properties"]
    # the shorthands the model reads (read_shorthands): a proposer, merge policy or router by its name alone
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
