"""Plugin discovery through entry points: distributions and versions, the SPECFRAME_PLUGINS allow-list, broken
plugins left out and listed with their error (import errors, misspelt hooks, contract breaks) while every other
plugin and command works, duplicate names refused naming both distributions, and `specframe plugins [--json]`."""

from __future__ import annotations

import json
import logging
import re

import pytest
from typer.testing import CliRunner

import specframe
from specframe import hookimpl
from specframe.cli import app
from specframe.errors import (
    DuplicateRegistrationError,
    PluginContractError,
    PluginLoadError,
    UnknownMergePolicyError,
    UnknownNameError,
    UnknownProposerError,
    UnknownRouterError,
    UnknownVerifierError,
)
from specframe.registry import ALLOW_ENV, build_registry

from tests.fakes import proposer_module

BROKEN_PROPOSE = 'raise RuntimeError("kaput")'


@pytest.fixture(autouse=True)
def _no_allow_list(monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)


def test_builtins_come_through_entry_points_with_their_distribution():
    reg = build_registry()
    by_name = {p.name: p for p in reg.plugins}
    assert by_name["ngram"].distribution == "specframe" and by_name["ngram"].module == "specframe_plugins.ngram"
    assert by_name["ngram"].version == specframe.__version__
    assert [c.name for c in by_name["none"].proposers] == ["none"]
    assert {c.name for c in by_name["specframe.verifiers"].verifiers} == {"greedy", "speculative-sampling"}
    assert reg.origin[("proposer", "ngram")] == f"ngram (specframe {specframe.__version__})"


def test_a_third_party_distribution_is_found_and_named(fake_dist):
    fake_dist("specframe-echo", "1.2.3", {"echo": "sf_echo_mod"}, {"sf_echo_mod": proposer_module("echo")})
    reg = build_registry()
    assert reg.proposer("echo").__module__ == "sf_echo_mod"
    assert reg.origin[("proposer", "echo")] == "echo (specframe-echo 1.2.3)"


def test_allow_list_by_entry_point_or_distribution_name(fake_dist, monkeypatch):
    fake_dist("specframe-echo", "1.0", {"echo": "sf_echo_mod"}, {"sf_echo_mod": proposer_module("echo")})
    monkeypatch.setenv(ALLOW_ENV, "ngram, specframe_echo")  # distribution names match normalised
    reg = build_registry()
    assert set(reg.proposers) == {"ngram", "echo"}
    assert set(reg.verifiers) == {"greedy", "speculative-sampling"}  # the core verifiers always load
    monkeypatch.setenv(ALLOW_ENV, "")
    assert build_registry().proposers == {}


def test_allow_list_naming_a_missing_plugin_fails_listing_the_installed_ones(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "ngram,ngarm")
    with pytest.raises(PluginLoadError, match=r"names 'ngarm', which no installed plugin provides; installed entry "
                                              r"points: .*ngram \(specframe\)"):
        build_registry()


def test_a_name_registered_twice_names_both_distributions_when_used(fake_dist):
    fake_dist("specframe-a", "1.0", {"a": "sf_dup_a"}, {"sf_dup_a": proposer_module("dup")})
    fake_dist("specframe-b", "2.0", {"b": "sf_dup_b"}, {"sf_dup_b": proposer_module("dup")})
    reg = build_registry()
    with pytest.raises(DuplicateRegistrationError) as err:
        reg.proposer("dup")
    msg = str(err.value)
    assert "proposer 'dup' is registered by both" in msg
    assert "specframe-a 1.0" in msg and "specframe-b 2.0" in msg and ALLOW_ENV in msg
    by_name = {p.name: p for p in reg.plugins}
    assert by_name["a"].conflicts == [msg] and by_name["b"].conflicts == [msg]
    assert reg.proposer("ngram").name == "ngram"  # every other name still works


def test_same_entry_point_name_in_two_distributions_does_not_shadow_silently(fake_dist):
    # both call their entry point "ngram": pluggy's loader would skip the second one without a word
    fake_dist("specframe-ngram2", "0.1", {"ngram": "sf_ngram2"}, {"sf_ngram2": proposer_module("ngram")})
    with pytest.raises(DuplicateRegistrationError, match=r"specframe 0\.1\.0\).*specframe-ngram2 0\.1|"
                                                         r"specframe-ngram2 0\.1.*specframe 0\.1\.0"):
        build_registry().proposer("ngram")


def _broken(reg, name):
    (info,) = [p for p in reg.plugins if p.name == name]
    assert info.error and not info.proposers
    return info.error


def test_a_misspelt_hook_leaves_the_plugin_out_naming_it(fake_dist, caplog):
    source = """
        from specframe import hookimpl

        @hookimpl
        def specframe_register_proposer(register):  # missing "s"
            pass
    """
    fake_dist("specframe-typo", "0.3", {"typo": "sf_typo"}, {"sf_typo": source})
    caplog.set_level(logging.WARNING, logger="specframe")
    reg = build_registry()
    error = _broken(reg, "typo")
    assert "unknown hook 'specframe_register_proposer'" in error
    assert ("known hooks: specframe_observe_request, specframe_observe_step, "
            "specframe_register_constraint_engines, specframe_register_merge_policies, "
            "specframe_register_proposers, specframe_register_reasoning_parsers, specframe_register_routers, "
            "specframe_register_tool_parsers, specframe_register_verifiers") in error
    assert reg.plugin_manager.get_plugin("typo") is None
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    assert warning.startswith("plugin typo (specframe-typo 0.3) is left out: unknown hook")


def test_a_hook_with_a_wrong_argument_leaves_the_plugin_out(fake_dist):
    source = """
        from specframe import hookimpl

        @hookimpl
        def specframe_register_proposers(registry):
            pass
    """
    fake_dist("specframe-arg", "0.1", {"arg": "sf_arg"}, {"sf_arg": source})
    assert "registry" in _broken(build_registry(), "arg")


def test_a_plugin_that_fails_to_import_is_listed_broken_and_the_rest_works(fake_dist):
    fake_dist("specframe-bad", "0.1", {"bad": "sf_bad"}, {"sf_bad": "import not_a_module_anywhere\n"})
    fake_dist("specframe-echo", "1.0", {"echo": "sf_echo_mod"}, {"sf_echo_mod": proposer_module("echo")})
    reg = build_registry()
    error = _broken(reg, "bad")
    assert error.startswith("failed to import 'sf_bad': ModuleNotFoundError: No module named 'not_a_module_anywhere'")
    assert ALLOW_ENV in error
    assert {"echo", "ngram", "none"} <= set(reg.proposers)
    with pytest.raises(UnknownProposerError, match=r"unknown proposer 'bad'; installed: .*; left out because they "
                                                   r"failed to load \(see `specframe plugins`\): bad \(specframe-bad "
                                                   r"0\.1\)"):
        reg.proposer("bad")


def test_a_class_breaking_the_contract_leaves_only_its_plugin_out(fake_dist):
    source = proposer_module("half").replace("register(P)", "register(P)\n            register(object)")
    fake_dist("specframe-half", "0.1", {"half": "sf_half"}, {"sf_half": source})
    raising = "from specframe import hookimpl\n@hookimpl\ndef specframe_register_proposers(register):\n    1 / 0\n"
    fake_dist("specframe-raise", "0.1", {"raise": "sf_raise"}, {"sf_raise": raising})
    reg = build_registry()
    assert "needs a `name` class attribute" in _broken(reg, "half")
    assert "half" not in reg.proposers  # nothing of a broken plugin is registered, not even its valid class
    assert "specframe_register_proposers hook raised ZeroDivisionError" in _broken(reg, "raise")
    assert "ngram" in reg.proposers


def test_every_command_works_beside_a_broken_plugin(fake_dist, no_model_load):
    fake_dist("specframe-bad", "0.1", {"bad": "sf_bad"}, {"sf_bad": "raise RuntimeError('kaput at import')\n"})
    listing = CliRunner().invoke(app, ["plugins"])
    assert listing.exit_code == 0, listing.output
    assert "bad  [specframe-bad 0.1]  sf_bad" in listing.stdout
    assert "  BROKEN, left out: failed to import 'sf_bad': RuntimeError: kaput at import" in listing.stdout
    assert "proposer ngram:" in listing.stdout
    doc = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).stdout)
    bad = next(p for p in doc["plugins"] if p["plugin"] == "bad")
    assert bad["error"].startswith("failed to import 'sf_bad'") and bad["proposers"] == []
    assert next(p for p in doc["plugins"] if p["plugin"] == "ngram")["error"] is None
    # generate gets as far as loading the model (forbidden here), so plugins and options were resolved
    with pytest.raises(AssertionError, match="a model load was attempted"):
        CliRunner().invoke(app, ["generate", "hi", "--proposer", "ngram", "--dtype", "float32"],
                           catch_exceptions=False)


class _Plugin:
    def __init__(self, cls):
        self.cls = cls

    @hookimpl
    def specframe_register_proposers(self, register):
        register(self.cls)


def _proposer(**attrs):
    from specframe import ProposerBase

    return type("P", (ProposerBase,), {"name": "p", **attrs})


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"name": ""}, "needs a `name` class attribute"),
        ({"name": "two words"}, "without spaces"),
        ({"Config": dict}, "must be a subclass of specframe.ProposerConfig"),
        ({"produces_trees": "no"}, "`produces_trees` must be True or False"),
        ({"propose": None}, "method `propose` is missing"),
    ],
)
def test_classes_that_break_the_contract_are_refused_at_registration(attrs, message):
    with pytest.raises(PluginContractError, match=message):
        build_registry(entry_points=False, extra_plugins=(_Plugin(_proposer(**attrs)),))


def test_a_config_model_must_forbid_unknown_options_and_accept_its_name():
    from typing import Literal

    from pydantic import ConfigDict

    from specframe import ProposerConfig

    class Loose(ProposerConfig):
        model_config = ConfigDict(extra="allow")

    with pytest.raises(PluginContractError, match="must forbid unknown options"):
        build_registry(entry_points=False, extra_plugins=(_Plugin(_proposer(Config=Loose)),))

    class Other(ProposerConfig):
        name: Literal["other"] = "other"

    with pytest.raises(PluginContractError, match=r"accepts \['other'\], not 'p'"):
        build_registry(entry_points=False, extra_plugins=(_Plugin(_proposer(Config=Other)),))

    class Loosely(ProposerConfig):  # a config must name its plugin (so a typed config holds its own objects)
        name: str = "p"

    with pytest.raises(PluginContractError, match=r"Loosely.name must be typed Literal\['p'\]"):
        build_registry(entry_points=False, extra_plugins=(_Plugin(_proposer(Config=Loosely)),))
    inherited = _proposer()  # a base class's subclass that declares no Config gets one naming it
    assert inherited.Config.model_fields["name"].annotation == Literal["p"] and inherited.Config().name == "p"
    assert build_registry(entry_points=False, extra_plugins=(_Plugin(inherited),)).proposer("p") is inherited


def test_unknown_proposer_lists_the_installed_ones(fake_dist):
    fake_dist("specframe-echo", "1.0", {"echo": "sf_echo_mod"}, {"sf_echo_mod": proposer_module("echo")})
    # (the built-in proposers are listed too, sorted: draft-model, echo, medusa, ngram, none, ...)
    with pytest.raises(UnknownProposerError, match=r"unknown proposer 'ehco'; installed: ([\w-]+, )*echo, ([\w-]+, )*ngram, none"):
        specframe.load(model="unused", target=object(), proposers=[{"name": "ehco"}])


@pytest.mark.parametrize("lookup, kind, error", [
    ("proposer", "proposer", UnknownProposerError),
    ("verifier", "verifier", UnknownVerifierError),
    ("merge_policy", "merge policy", UnknownMergePolicyError),
    ("router", "router", UnknownRouterError),
])
def test_an_unknown_name_raises_the_error_of_its_kind(lookup, kind, error):
    with pytest.raises(error, match=f"^unknown {kind} 'nope'; installed: ") as err:
        getattr(build_registry(), lookup)("nope")
    assert isinstance(err.value, UnknownNameError) and isinstance(err.value, KeyError)
    assert isinstance(err.value, UnknownProposerError) == (kind == "proposer")


def test_the_api_names_the_kind_of_an_unknown_merge_policy_or_router():
    from specframe.target.hf import Target

    from tests.fakes import build_model, build_tokenizer

    target = Target(build_model("llama"), build_tokenizer())
    two = [{"name": "ngram"}, {"name": "none"}]
    with pytest.raises(UnknownMergePolicyError, match="unknown merge policy 'nope'"):
        specframe.load(target=target, proposers=two, merge={"policy": "nope"})
    with pytest.raises(UnknownRouterError, match="unknown router 'nope'"):
        specframe.load(target=target, proposers=two, router="nope")
    with pytest.raises(UnknownVerifierError, match="unknown verifier 'nope'"):
        specframe.load(target=target, verifier="nope")


def test_the_fault_warning_names_the_distribution(fake_dist, specframe_tiny_target, caplog):
    fake_dist("specframe-kaput", "9.9", {"kaput": "sf_kaput"},
              {"sf_kaput": proposer_module("kaput", body=BROKEN_PROPOSE)})
    sf = specframe.load(target=specframe_tiny_target, proposers=[{"name": "kaput"}])
    caplog.set_level(logging.WARNING, logger="specframe")
    sf.generate_result([1, 2, 3], max_new_tokens=4)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "specframe"]
    # the plugin's own file and line, for its author (the innermost frame of the traceback)
    assert re.match(r"proposer 'kaput' \(plugin kaput \(specframe-kaput 9\.9\)\) raised RuntimeError at sf_kaput\.py:\d+ "
                    r"in propose: kaput", warning), warning


# --- specframe plugins --------------------------------------------------------------------------------------


def test_plugins_json_lists_every_plugin_with_its_proposers(fake_dist):
    fake_dist("specframe-echo", "1.2.3", {"echo": "sf_echo_mod"}, {"sf_echo_mod": proposer_module("echo")})
    result = CliRunner().invoke(app, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    by_name = {p["plugin"]: p for p in doc["plugins"]}
    echo = by_name["echo"]
    assert (echo["distribution"], echo["version"], echo["module"]) == ("specframe-echo", "1.2.3", "sf_echo_mod")
    assert [p["name"] for p in echo["proposers"]] == ["echo"]
    ngram = by_name["ngram"]["proposers"][0]
    assert ngram["capabilities"] == {"tree_drafts": True, "draft_probs": False, "needs_hidden_states": False}
    k = next(o for o in ngram["config"] if o["option"] == "k")
    assert k == {"option": "k", "type": "int", "required": False, "default": 8, "constraints": ">=1, <=64",
                 "description": "Draft length: most tokens proposed per step."}
    assert [v["name"] for v in by_name["specframe.verifiers"]["verifiers"]] == ["greedy", "speculative-sampling"]


def test_plugins_text_output():
    result = CliRunner().invoke(app, ["plugins"])
    assert result.exit_code == 0
    assert "ngram  [specframe " in result.stdout
    assert "  proposer ngram: Prompt lookup" in result.stdout
    assert "    capabilities: chain drafts, deterministic drafts" in result.stdout
    assert "    k: int = 8 (>=1, <=64)  Draft length" in result.stdout


def test_plugins_reports_a_broken_install_in_one_line(monkeypatch):
    monkeypatch.setenv(ALLOW_ENV, "nope")
    result = CliRunner().invoke(app, ["plugins", "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: SPECFRAME_PLUGINS names 'nope'") and result.stderr.count("\n") == 1


def test_plugins_shows_whole_summaries_and_real_defaults():
    import inspect

    from specframe.registry import build_registry

    doc = json.loads(CliRunner().invoke(app, ["plugins", "--json"]).stdout)
    assert "<factory>" not in json.dumps(doc)
    router = next(r for p in doc["plugins"] for r in p["routers"] if r["name"] == "adaptive")
    assert router["summary"].endswith("trims what is not worth verifying.")  # was cut after "after each"
    assert next(o for o in router["config"] if o["option"] == "draft_cost")["default"] == {}
    reg = build_registry()
    for kind, table in (("proposers", reg.proposers), ("routers", reg.routers), ("merge_policies", reg.merge_policies)):
        for entry in (e for p in doc["plugins"] for e in p[kind]):
            first = inspect.cleandoc(table[entry["name"]].__doc__ or "").split("\n\n")[0]
            assert entry["summary"] == " ".join(first.split()), entry["name"]
    text = CliRunner().invoke(app, ["plugins"]).stdout
    assert "draft_cost: dict[str, float] = {}" in text and "<factory>" not in text
