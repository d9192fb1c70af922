"""One settings model per training recipe, feeding its command line.

Each recipe's settings dataclass (:class:`~specframe.training.draft.DraftSettings`,
:class:`~specframe.training.medusa.MedusaSettings`, :class:`~specframe.training.eagle.EagleSettings`) marks the
fields a user sets from ``specframe train KIND`` with :func:`cli` metadata: the flag, its help, its bounds. From
that one place come

- the command's options and their defaults (:func:`parameters`: the dataclass default *is* the CLI default),
- the checks of the given values, one error naming the flag (:func:`settings_from_options`),
- the model card's "Reproduce" line (:func:`reproduce_flags`).

Fields without the metadata (``warmup``, ``autocast``, ...) are settings a test or a script may change, not flags.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError


@dataclass(frozen=True)
class Flag:
    """How one settings field appears on the command line.

    Attributes:
        flag: the option, e.g. ``"--epochs"``.
        help: the option's help text.
        low: the smallest value allowed (inclusive), or None.
        positive: the value must be > 0 (a learning rate).
        choices: the values allowed for a string field (empty: any).
        ints: a list / tuple of ints given as comma-separated text (``--layers 0,1``); an empty text is None.
        path: a string field given as a path (``--init``).
        negate: a bool field set by a flag that turns it off (``--hard-labels`` sets ``soft_labels`` False).
        omit: values left out of the reproduce line (``max_records`` 0: "all records" is the default meaning).
    """

    flag: str
    help: str
    low: Optional[float] = None
    positive: bool = False
    choices: tuple[str, ...] = ()
    ints: bool = False
    path: bool = False
    negate: bool = False
    omit: tuple = ()


def cli(flag: str, help: str, **kw: Any) -> dict:
    """Field metadata that makes a settings field a ``specframe train`` option (``field(..., metadata=cli(...))``)."""
    return {"cli": Flag(flag, help, **kw)}


def flags(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    """The fields of settings class ``cls`` that are options, in field order."""
    return [(f, f.metadata["cli"]) for f in dataclasses.fields(cls) if "cli" in f.metadata]


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def parameters(cls: type) -> list[inspect.Parameter]:
    """Typer parameters (keyword-only, named as the fields) for the options of ``cls``, defaults from the dataclass."""
    import typer

    hints = typing.get_type_hints(cls)
    out = []
    for f, flag in flags(cls):
        default = _default(f)
        if flag.ints:
            kind, value = str, ",".join(str(v) for v in default or ())
        elif flag.path:
            kind, value = Optional[Path], (Path(default) if default else None)
        elif flag.negate:
            kind, value = bool, not default
        else:
            kind, value = hints[f.name], default
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                     default=typer.Option(value, flag.flag, help=flag.help)))
    return out


def settings_from_options(cls: type, given: dict, **fixed: Any) -> Any:
    """The settings ``cls(...)`` from the command's option values ``given`` (named as the fields) plus ``fixed``.

    Raises:
        ConfigError: a value out of bounds, not one of the choices, or not comma-separated integers — naming the flag.
    """
    values = dict(fixed)
    for f, flag in flags(cls):
        v = given[f.name]
        if flag.ints:
            try:
                ints = [int(x) for x in str(v).split(",") if x.strip()]
            except ValueError:
                raise ConfigError(f"{flag.flag} must be comma-separated integers, got {v!r}") from None
            v = ints if _default(f) is not None else (tuple(ints) or None)  # None default: empty = unset
        elif flag.path:
            v = "" if v is None else str(v)
        elif flag.negate:
            v = not v
        elif flag.positive and not v > 0:
            raise ConfigError(f"{flag.flag} must be > 0, got {v}")
        elif flag.low is not None and v < flag.low:
            raise ConfigError(f"{flag.flag} must be >= {flag.low:g}, got {v}")
        elif flag.choices and v not in flag.choices:
            raise ConfigError(f"{flag.flag} {v!r}: choose {' or '.join(flag.choices)}")
        values[f.name] = v
    return cls(**values)


def reproduce_flags(cls: type, settings: dict) -> str:
    """The flags of ``specframe train`` that give ``settings`` (a recipe.json's ``settings`` of class ``cls``), e.g.
    `` --epochs 1 --lr 0.001``; a value in the field's ``omit`` and an unset (None) one are left out."""
    out = []
    for f, flag in flags(cls):
        value = settings.get(f.name)
        if flag.negate:
            if value is False:
                out.append(f" {flag.flag}")
            continue
        if value is None or value in flag.omit:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        out.append(f" {flag.flag} {value}")
    return "".join(out)
