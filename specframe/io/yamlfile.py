"""Reading the YAML files specframe is given (the main config, bench and replay configs, YAML on the command line).

One reader, so every file gets the same checks and the same one-line messages (:class:`~specframe.errors.ConfigError`):
the file must be UTF-8 text (a UTF-8 BOM is allowed), valid YAML, and no mapping may give the same key twice — PyYAML's
``safe_load`` silently keeps the last value, so ``max_new_tokens`` given twice would run with whichever came last.
A merge key (``<<: *base``) may still be overridden by the mapping's own keys, as YAML intends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, line: int) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first_line, self.line = key, first_line, line


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (raises ``_DuplicateKey``, a YAMLError)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise _DuplicateKey(key, first, line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str) -> Any:
    """``text`` parsed by :class:`UniqueKeyLoader`; ``where`` names the source in messages (a path, a flag).

    Raises:
        ConfigError: ``<where> line N: duplicate key 'k' (first given on line M): keep one`` or
            ``<where> line N: invalid YAML (<problem>)``.
    """
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except _DuplicateKey as exc:
        raise ConfigError(f"{where} line {exc.line}: duplicate key {exc.key!r} (first given on line "
                          f"{exc.first_line}): keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise ConfigError(f"{where}{line}: invalid YAML" + (f" ({problem})" if problem else "")) from None
    except RecursionError:  # (PyYAML builds nested values recursively: a few hundred levels stop it)
        raise ConfigError(f"{where}: nests deeper than the YAML reader goes (a few hundred levels of mappings and "
                          "lists): flatten it") from None


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """Read and parse the YAML file ``path`` (``what`` names it in messages, e.g. ``"bench config"``).

    Returns what the file holds (None for an empty file).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 text (the message gives the byte offset and line of the
            first bad byte), is not valid YAML, or repeats a key (see :func:`parse_yaml`).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}, line "
                          f"{line}): save it as UTF-8") from None
    return parse_yaml(text, str(path))
