"""What is installed: every plugin with its distribution, version, and the proposers / verifiers / merge policies /
routers it provides (capabilities and a config summary), and for a plugin that failed to load, its error.
``specframe plugins [--json]`` prints this.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .registry import PluginInfo, Registry


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("NoneType", "None")


def _constraints(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign}{value}")
    return ", ".join(parts)


def _default(info: FieldInfo) -> Any:
    """The option's default as JSON (a ``default_factory`` is called: ``{}``, not ``<factory>``); ``repr`` of one
    that JSON cannot hold."""
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # pydantic's factories take no argument unless they ask for the data
        except TypeError:
            return None
    elif info.default is PydanticUndefined:
        return None
    else:
        value = info.default
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def config_summary(config: type, skip: tuple[str, ...] = ("name",)) -> list[dict[str, Any]]:
    """One entry per option of a config model but those in ``skip`` (the selecting field, ``name``)."""
    out = []
    for field_name, info in config.model_fields.items():
        if field_name in skip:
            continue
        out.append({
            "option": field_name,
            "type": _type_name(info.annotation),
            "required": info.is_required(),
            "default": _default(info),
            "constraints": _constraints(info),
            "description": info.description or "",
        })
    return out


def _doc(cls: type) -> str:
    """The docstring's first paragraph on one line (a summary wrapped over several lines is kept whole)."""
    first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
    return " ".join(first.split())


def proposer_summary(cls: type) -> dict[str, Any]:
    return {
        "name": cls.name,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "summary": _doc(cls),
        "capabilities": {
            "tree_drafts": cls.produces_trees,
            "draft_probs": cls.provides_draft_probs,
            "needs_hidden_states": cls.needs_hidden_states,
        },
        "config": config_summary(cls.Config),
    }


def verifier_summary(cls: type) -> dict[str, Any]:
    return {
        "name": cls.name,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "summary": _doc(cls),
        "capabilities": {"tree_drafts": cls.supports_trees},
    }


def component_summary(cls: type, skip: str) -> dict[str, Any]:
    """A merge policy or router; ``skip`` is its selecting field (``name`` for both)."""
    return {
        "name": cls.name,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "summary": _doc(cls),
        "config": config_summary(cls.Config, (skip,)),
    }


def parser_summary(cls: type) -> dict[str, Any]:
    """A tool-call or reasoning parser (text formats have no config)."""
    return {"name": cls.name, "class": f"{cls.__module__}.{cls.__qualname__}", "summary": _doc(cls)}


def plugin_summary(info: PluginInfo) -> dict[str, Any]:
    return {
        "plugin": info.name,
        "distribution": info.distribution,
        "version": info.version,
        "module": info.module,
        "proposers": [proposer_summary(c) for c in info.proposers],
        "verifiers": [verifier_summary(c) for c in info.verifiers],
        "merge_policies": [component_summary(c, "name") for c in info.merge_policies],
        "routers": [component_summary(c, "name") for c in info.routers],
        "tool_parsers": [parser_summary(c) for c in info.tool_parsers],
        "reasoning_parsers": [parser_summary(c) for c in info.reasoning_parsers],
        "observes": list(info.observes),
        "error": info.error,  # why it is left out (it failed to load); null = loaded
        "conflicts": list(info.conflicts),  # names another plugin registers too (refused when used)
    }


def inventory(registry: Registry) -> dict[str, Any]:
    """The ``specframe plugins --json`` document: ``{"plugins": [...]}``."""
    return {"plugins": [plugin_summary(p) for p in registry.plugins]}


def _options(config: list[dict[str, Any]]) -> list[str]:
    lines = []
    for o in config:
        value = "required" if o["required"] else f"= {json.dumps(o['default'])}"
        limits = f" ({o['constraints']})" if o["constraints"] else ""
        lines.append(f"    {o['option']}: {o['type']} {value}{limits}  {o['description']}".rstrip())
    return lines


def render_text(doc: dict[str, Any]) -> str:
    """Human-readable form of :func:`inventory`."""
    lines = []
    for p in doc["plugins"]:
        dist = f"{p['distribution']} {p['version']}".strip() or "registered directly"
        lines.append(f"{p['plugin']}  [{dist}]  {p['module']}")
        if p.get("error"):
            lines.append(f"  BROKEN, left out: {p['error']}")
        for conflict in p.get("conflicts", []):
            lines.append(f"  conflict: {conflict}")
        for v in p["verifiers"]:
            trees = "trees" if v["capabilities"]["tree_drafts"] else "chains"
            lines.append(f"  verifier {v['name']}: {v['summary']} ({trees})")
        for pr in p["proposers"]:
            caps = pr["capabilities"]
            flags = [
                "tree drafts" if caps["tree_drafts"] else "chain drafts",
                "draft probabilities" if caps["draft_probs"] else "deterministic drafts",
            ] + (["needs the target's hidden states"] if caps["needs_hidden_states"] else [])
            lines.append(f"  proposer {pr['name']}: {pr['summary']}")
            lines.append(f"    capabilities: {', '.join(flags)}")
            lines += _options(pr["config"])
        for kind, key in (("merge policy", "merge_policies"), ("router", "routers")):
            for c in p.get(key, []):
                lines.append(f"  {kind} {c['name']}: {c['summary']}")
                lines += _options(c["config"])
        for kind, key in (("tool parser", "tool_parsers"), ("reasoning parser", "reasoning_parsers")):
            for c in p.get(key, []):
                lines.append(f"  {kind} {c['name']}: {c['summary']}")
        if p["observes"]:
            lines.append(f"  observes: {', '.join(p['observes'])}")
    return "\n".join(lines)
