"""The public faces of combining proposers: API JSON attribution and observer events, validation of the
combination settings at load, the CLI's repeated --proposer, and the bench's attribution report."""

from __future__ import annotations

import json

import pytest

import specframe
from specframe import hookimpl
from specframe.errors import ConfigError
from specframe.registry import build_registry

from tests.fakes import COMBINING_N_NEW as N_NEW  # the references in envs (conftest) hold N_NEW + 8 tokens
from tests.fakes import PROMPT, build_model, build_tokenizer, hf_greedy

# --- the public faces ---------------------------------------------------------------------------------------------------


class _Plugin:
    def __init__(self, *classes):
        self.classes = classes

    @hookimpl
    def specframe_register_proposers(self, register):
        for cls in self.classes:
            register(cls)


class Events:
    def __init__(self):
        self.steps = []

    @hookimpl
    def specframe_observe_step(self, event):
        self.steps.append(event)


def test_api_json_attribution_and_observer_events(envs):
    target, refs, _ = envs["llama"]
    events = Events()
    sf = specframe.load(target=target, registry=build_registry(extra_plugins=(events,)),
                        proposers=[{"name": "ngram", "k": 4}, {"name": "ngram", "k": 2, "max_n": 2}],
                        merge={"policy": "confidence", "max_nodes": 6}, router="none")
    record = sf.generate(PROMPT, max_new_tokens=N_NEW)
    assert record["token_ids"] == refs[0][:N_NEW]
    m = record["metrics"]
    assert list(m["proposers"]) == ["ngram", "ngram#2"]
    for entry in m["proposers"].values():
        assert {"drafted_nodes", "accepted_nodes", "accepted_alone", "wasted_nodes", "draft_s", "acceptance_rate",
                "steps", "skipped_steps", "faults", "disabled"} <= set(entry)
        assert entry["steps"] == m["target_forwards"] - 1 or entry["steps"] == m["target_forwards"]
    assert len(events.steps) == m["target_forwards"]
    assert {e.proposer for e in events.steps} == {"ngram+ngram#2"}
    for label in ("ngram", "ngram#2"):
        assert sum(s.accepted for e in events.steps for s in e.attribution if s.name == label) == \
            m["proposers"][label]["accepted_nodes"]
    # a single proposer has its attribution too, equal to the request's counts
    single = sf.generate(PROMPT, max_new_tokens=N_NEW, proposers=[{"name": "ngram"}])["metrics"]
    assert single["proposers"]["ngram"]["accepted_nodes"] == single["accepted_nodes"]
    assert single["proposers"]["ngram"]["drafted_nodes"] == single["drafted_nodes"]
    # per-request overrides of the merge policy and router
    assert sf.generate(PROMPT, max_new_tokens=8, merge="priority", router="adaptive")["token_ids"] == refs[0][:8]


@pytest.mark.parametrize("settings, needle", [
    ({"merge": {"policy": "nope"}}, "unknown merge policy 'nope'"),
    ({"merge": {"max_nodes": 0}}, "merge.max_nodes"),
    ({"merge": {"policy": "priority", "decay": 0.5}}, "merge policy 'priority': decay"),
    ({"merge": {"policy": "confidence", "decay": 2}}, "decay"),
    ({"router": "nope"}, "unknown router 'nope'"),
    ({"router": {"name": "adaptive", "probe_every": 0}}, "probe_every"),
    ({"router": {"name": "none", "decay": 0.5}}, "router: none takes no options"),
])
@pytest.mark.parametrize("proposers", [[{"name": "ngram"}, {"name": "ngram", "k": 2}], [{"name": "ngram"}]],
                         ids=["combined", "single"])
def test_combination_settings_are_validated_at_load(envs, settings, needle, proposers):
    # with a single proposer too: a typo fails now, not on the day a second proposer is added
    target, _, _ = envs["llama"]
    with pytest.raises((ConfigError, KeyError), match=needle):
        specframe.load(target=target, registry=build_registry(), proposers=proposers, **settings)


def test_cli_combines_repeated_proposers(tmp_path):
    from typer.testing import CliRunner

    from specframe import cli

    model = build_model("llama")
    model.save_pretrained(tmp_path)
    build_tokenizer().save_pretrained(tmp_path)
    prompt = " ".join(build_tokenizer().convert_ids_to_tokens(PROMPT))
    base = [prompt, "--model", str(tmp_path), "--dtype", "float32", "--no-chat", "--max-new-tokens", "12"]
    result = CliRunner().invoke(cli.app, ["generate", *base, "--json", "--proposer", "ngram", "--proposer", "none",
                                          "--merge", "confidence", "--max-nodes", "8", "--router", "none"])
    assert result.exit_code == 0, (result.output, result.exception)
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert record["token_ids"] == hf_greedy(model, PROMPT, 12)
    assert list(record["metrics"]["proposers"]) == ["ngram", "none"]
    result = CliRunner().invoke(cli.app, ["generate", *base, "--proposer", "ngram", "--proposer", "none"])
    assert result.exit_code == 0 and "ngram: " in result.stderr and "none: " in result.stderr
    bad = CliRunner().invoke(cli.app, ["generate", *base, "--proposer", "ngram", "--proposer", "none", "--merge", "x"])
    assert bad.exit_code == 2 and "unknown merge policy 'x'" in bad.stderr


def test_bench_strategy_combining_proposers_reports_attribution(envs):
    from specframe.bench.config import BenchConfig
    from specframe.bench.report import aggregate, render_markdown
    from specframe.bench.runner import BenchRunner, environment, lossless_check
    from specframe.io.prompts import Prompt

    target, _, _ = envs["llama"]
    sf = specframe.load(target=target, registry=build_registry())
    cfg = BenchConfig.model_validate(dict(max_new_tokens=12, warmup=0, strategies=[
        {"name": "combo", "proposers": [{"name": "ngram", "k": 4}, {"name": "ngram", "k": 2, "max_n": 2}],
         "merge": {"policy": "priority", "max_nodes": 6}, "router": "adaptive"},
    ]))
    questions = [Prompt("aa ab ac aa ab ad ae aa ab", 1, "summarization"), Prompt("ba bb bc ba bb bd", 2, "qa")]
    records = BenchRunner(sf, cfg).run(questions)
    assert lossless_check(sf, records, questions, cfg.chat) == []
    summary = aggregate(records, [s.name for s in cfg.strategies])
    attribution = summary["strategies"]["combo"]["attribution"]
    assert set(attribution) == {"ngram", "ngram#2"}
    assert all(0 <= a["acceptance_rate"] <= 1 and a["run_share"] <= 1 for a in attribution.values())
    results = {"config": cfg.model_dump(), "environment": environment(), "summary": summary, "lossless": [],
               "records": records, "profile": None}
    text = render_markdown(results, [])
    assert "## Attribution by proposer" in text and "### combo" in text and "| ngram#2 |" in text
    with pytest.raises(Exception, match="not peers"):
        BenchConfig.model_validate(dict(strategies=[{"name": "p", "peer": "hf-greedy", "router": "none"}]))
