"""The config's typed form over the installed plugins (a discriminated union by ``name``) and its JSON Schema, which
agrees with the loader on every snippet and on every config the docs ship."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from specframe import cli
from specframe.config import SpecframeConfig, config_schema, load_config, resolve_plugins, typed_config_model
from specframe.registry import build_registry

from tests.fakes import ROOT

DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def registry():
    return build_registry()


def test_the_typed_config_reads_the_shorthands_into_each_plugins_own_config(registry):
    model = typed_config_model(registry)
    cfg = model.model_validate({"proposers": ["ngram", {"name": "medusa", "num_heads": 2}], "router": "none",
                                "merge": {"policy": "confidence"}})
    assert [type(p).__name__ for p in cfg.proposers] == ["NgramConfig", "MedusaConfig"]
    assert cfg.proposers[0].k == 8 and cfg.proposers[1].num_heads == 2
    assert cfg.router is None and type(cfg.merge).__name__ == "ConfidenceConfig"
    default = model.model_validate({})
    assert [p.name for p in default.proposers] == ["ngram"] and default.router.name == "adaptive"
    assert default.merge.name == "priority" and default.merge.max_nodes == 24
    with pytest.raises(ValidationError):
        cfg.dtype = "float32"  # frozen


@pytest.mark.parametrize("data", [
    {"proposers": [{"name": "ngram", "bogus": 1}]},  # an option no plugin declares
    {"proposers": [{"name": "no-such-proposer"}]},
    {"proposers": []},
    {"router": {"name": "adaptive", "bogus": 1}},
    {"merge": {"name": "priority", "max_nodes": 0}},
])
def test_the_typed_config_refuses_what_resolve_plugins_refuses(registry, data):
    with pytest.raises(ValidationError):
        typed_config_model(registry).model_validate(data)
    with pytest.raises(Exception):  # noqa: B017 - the one path raises ConfigError / Unknown*Error with its own line
        resolve_plugins(load_config(None, **data), registry)


def test_the_example_config_validates_and_agrees_with_resolve_plugins(registry):
    import yaml

    data = yaml.safe_load((DOCS / "specframe.example.yaml").read_text())
    typed = typed_config_model(registry).model_validate(data)
    resolved = resolve_plugins(load_config(DOCS / "specframe.example.yaml"), registry)
    assert [p.model_dump() for p in typed.proposers] == [c.model_dump() for _, c in resolved.proposers]


def test_the_schema_lists_every_installed_proposer(registry):
    schema = config_schema(registry)
    by_name, listed = schema["properties"]["proposers"]["anyOf"]  # `proposers: ngram`, or a list
    mapping = listed["items"]["anyOf"][1]["discriminator"]["mapping"]
    assert set(mapping) == set(registry.proposers) and {"ngram", "eagle", "none"} <= set(mapping)
    assert set(by_name["enum"]) == set(registry.proposers) == set(listed["items"]["anyOf"][0]["enum"])
    out = CliRunner().invoke(cli.app, ["plugins", "--schema"])
    assert out.exit_code == 0 and json.loads(out.stdout)["title"] == "specframe config"


@pytest.mark.parametrize("data", [
    {"router": "none"}, {"router": None}, {"router": False}, {"router": {"name": "none"}}, {"router": "adaptive"},
    {"router": {"name": "adaptive", "free_cost": 0.01}}, {"merge": "confidence"}, {"merge": {"policy": "confidence"}},
    {"proposers": "ngram"}, {"proposers": ["ngram", {"name": "medusa", "num_heads": 2}], "merge": {"max_nodes": 12}},
    {"router": {"free_cost": 0.01}},
])
def test_the_runtime_config_and_the_typed_model_read_a_shorthand_alike(registry, data):
    """One reading of the shorthands (config.read_shorthands): the typed model's plugins are the ones
    resolve_plugins builds from the runtime config (no router = None in both)."""
    typed = typed_config_model(registry).model_validate(data)
    resolved = resolve_plugins(SpecframeConfig.model_validate(data), registry, lone_router=True)
    assert [p.model_dump() for p in typed.proposers] == [c.model_dump() for _, c in resolved.proposers]
    assert (typed.router is None) == (resolved.router is None)
    if resolved.router is not None:
        assert typed.router.model_dump() == resolved.router[1].model_dump()
    if resolved.merge is not None:
        assert typed.merge.model_dump() == resolved.merge[1].model_dump()


def test_a_loaded_specframe_runs_with_the_typed_config(specframe_tiny_target):
    """``sf.config`` is the typed model: each proposer its plugin's own config object, the router's and merge
    policy's too (None for ``router: none``); it loads again as it is and decodes the same."""
    import specframe

    sf = specframe.load(target=specframe_tiny_target, proposers=["ngram", {"name": "ngram", "k": 3}],
                        merge={"name": "priority", "max_nodes": 6}, router="none", max_new_tokens=12)
    cfg = sf.config
    assert [type(p).__name__ for p in cfg.proposers] == ["NgramConfig", "NgramConfig"]
    assert cfg.proposers[1].k == 3 and cfg.router is None and cfg.merge.max_nodes == 6
    assert type(cfg).__name__ == "TypedSpecframeConfig"
    with pytest.raises(ValidationError):
        cfg.max_new_tokens = 5  # frozen
    again = specframe.load(cfg, target=specframe_tiny_target)
    assert again.config == cfg  # (registries with the same plugins give the same typed class)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    assert again.generate_result(prompt).token_ids == sf.generate_result(prompt).token_ids
    lone = specframe.load(target=specframe_tiny_target)  # nothing set: the default router is the config's router
    assert lone.config.router is not None and lone.config.router.name == "adaptive"
    assert "router" not in lone.config.model_fields_set


def test_a_file_loads_into_the_form_a_loaded_instance_runs_with(registry, specframe_tiny_target, tmp_path):
    """One config form: ``load_config`` gives the typed config, each plugin entry its plugin's own ``Config`` class,
    and it is what ``specframe.load`` of the same file runs with."""
    import specframe
    from specframe.config import runtime_config

    path = tmp_path / "c.yaml"
    path.write_text("proposers: [ngram, {name: ngram, k: 3}]\nmerge: {name: confidence, max_nodes: 9}\n"
                    "router: none\nmax_new_tokens: 12\n")
    cfg = load_config(path, registry=registry)
    assert type(cfg) is typed_config_model(registry) is typed_config_model(build_registry())
    assert [type(p) for p in cfg.proposers] == [registry.proposer("ngram").Config] * 2
    assert type(cfg.merge) is registry.merge_policy("confidence").Config and cfg.merge.max_nodes == 9
    assert cfg.router is None and cfg.model_fields_set == {"proposers", "merge", "router", "max_new_tokens"}
    assert runtime_config(cfg, registry) == cfg  # already typed: nothing left to convert
    assert specframe.load(path, target=specframe_tiny_target).config == cfg


@pytest.mark.parametrize("overrides", [
    {},
    {"proposers": "ngram"},
    {"proposers": ["ngram", {"name": "ngram", "k": 2}], "merge": "confidence"},
    {"router": "none"},
    {"proposers": ["ngram", {"name": "ngram", "k": 2}], "router": {"name": "adaptive"}},
    {"merge": {"policy": "priority", "max_nodes": 5}},
])
def test_request_overrides_apply_to_the_typed_config_as_to_the_file(registry, overrides):
    """A request's overrides resolve on the typed config (``sf.config``) exactly as on a config loaded with the same
    values written in; the typed config's own objects are used as they are (no round trip)."""
    base = {"proposers": [{"name": "ngram", "k": 3}, {"name": "ngram", "k": 5}], "merge": {"name": "priority",
                                                                                       "max_nodes": 7}}
    typed = load_config(None, registry=registry, **base)
    request = resolve_plugins(typed, registry, **overrides)
    file_form = resolve_plugins(load_config(None, **{**base, **overrides}), registry)
    dump = [(c, cfg.model_dump()) for c, cfg in request.proposers]
    assert dump == [(c, cfg.model_dump()) for c, cfg in file_form.proposers]
    for part in ("merge", "router"):
        mine, theirs = getattr(request, part), getattr(file_form, part)
        assert (mine is None) == (theirs is None)
        if mine is not None:
            assert mine[0] is theirs[0] and mine[1].model_dump() == theirs[1].model_dump()
    if "proposers" not in overrides:
        assert all(cfg is own for (_, cfg), own in zip(request.proposers, typed.proposers))


def test_a_malformed_request_override_names_the_field(registry):
    from specframe.errors import ConfigError, UnknownProposerError

    typed = load_config(None, registry=registry)
    with pytest.raises(ConfigError, match=r"merge.max_nodes"):
        resolve_plugins(typed, registry, merge={"name": "priority", "max_nodes": 0})
    with pytest.raises(ConfigError, match=r"proposers"):
        resolve_plugins(typed, registry, proposers=[])
    with pytest.raises(UnknownProposerError, match="ngram"):
        resolve_plugins(typed, registry, proposers="nope")


# --- the schema and the loader agree on every snippet and shipped config (issue 39, 3) --------------------------------


GOOD = ["router: adaptive", "router: none", "router: null", "router: false", "merge: confidence",
        "proposers: [ngram]", "proposers: ngram", "proposers: [ngram, {name: medusa}]", "threads: 2",
        "max_new_tokens: 1", "sampling: {temperature: 0.7, top_p: 1.0, top_k: 0, seed: 0}", "stop: ['\\n\\n']",
        "merge: {name: confidence, max_nodes: 16}", "router: {name: adaptive, explore: 0.0}"]
BAD = ["max_new_tokens: 0", "threads: 2000", "threads: 0", "sampling: {temperature: -1}", "sampling: {top_p: 1.5}",
       "sampling: {top_p: 0}", "sampling: {top_k: -3}", "sampling: {seed: -1}", "stop: ['']", "proposers: nosuch",
       "proposers: []", "router: sometimes", "merge: nosuch", "unknown_key: 1"]


@pytest.fixture(scope="module")
def schema_and_loader():
    jsonschema = pytest.importorskip("jsonschema")
    registry = build_registry()
    validator = jsonschema.Draft202012Validator(config_schema(registry))

    def loader_ok(path) -> bool:
        try:
            resolve_plugins(load_config(path), registry)
        except Exception:  # noqa: BLE001 - the loader's refusal, whatever its kind
            return False
        return True

    return validator, loader_ok


@pytest.mark.parametrize("snippet", GOOD + BAD)
def test_the_schema_and_the_loader_agree_on_a_snippet(snippet, schema_and_loader, tmp_path):
    import yaml

    validator, loader_ok = schema_and_loader
    path = tmp_path / "c.yaml"
    path.write_text(snippet + "\n")
    want = snippet in GOOD
    assert loader_ok(path) is want
    assert validator.is_valid(yaml.safe_load(snippet)) is want, list(validator.iter_errors(yaml.safe_load(snippet)))


def test_every_shipped_config_passes_the_schema(schema_and_loader):
    import re

    import yaml

    validator, _ = schema_and_loader
    configs = [p.read_text() for p in sorted(DOCS.glob("*.yaml"))]
    for doc in sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        configs += re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)
    checked = 0
    for text in configs:
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict) or {"strategies", "servers", "grid"} & set(data) or "train" in data:
            continue  # bench and training configs have schemas of their own
        errors = [e.message for e in validator.iter_errors(data)]
        assert not errors, (text[:200], errors)
        checked += 1
    assert checked >= 3
