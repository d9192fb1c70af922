"""Merge policies (docs/combining.md): the built-in priority and confidence policies, a third-party policy as the
document writes it, the merge-policy and router plugin contracts, and a single proposer without any policy."""

from __future__ import annotations

import pytest

import specframe
from specframe import DraftTree, hookimpl
from specframe.contracts.combining import MergePolicyBase, MergePolicyConfig, RouterBase, RouterConfig, StepReport
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe_plugins.merge_policies import (
    ConfidenceConfig,
    ConfidencePolicy,
    PriorityConfig,
    PriorityPolicy,
    share_budget,
)

from tests.fakes import COMBINING_N_NEW as N_NEW  # the references in envs (conftest) hold N_NEW + 8 tokens
from tests.fakes import PROMPT, ROOT, chain, step

# --- the built-in policies --------------------------------------------------------------------------------------------


def test_priority_plan_and_config():
    policy = PriorityPolicy(PriorityConfig(max_nodes=5))
    assert policy.max_nodes == 5
    assert policy.plan([chain([1, 2]), DraftTree.empty(), chain([3])], 5) == [(0, 2), (1, 0), (2, 1)]
    with pytest.raises(Exception, match="max_nodes"):
        PriorityConfig(max_nodes=0)


def test_share_budget_water_fills():
    assert share_budget([6, 5], [0.6, 0.2], 8) == [(0, 6), (1, 2)]
    assert share_budget([3, 5], [0.6, 0.2], 8) == [(0, 3), (1, 5)]  # what one cannot use goes to the other
    assert share_budget([0, 5, 5], [0.9, 0.1, 0.1], 4) == [(1, 2), (2, 2)]  # an empty draft gets nothing
    assert share_budget([9, 9], [0.5, 0.5], 3) == [(0, 2), (1, 1)]  # ties: proposer order
    assert sum(q for _, q in share_budget([30, 30, 30], [0.7, 0.2, 0.05], 24)) == 24


def test_confidence_policy_follows_live_acceptance():
    policy = ConfidencePolicy(ConfidenceConfig(max_nodes=8, decay=0.5))
    policy.start(["a", "b"])
    drafts = [chain([1] * 8), chain([2] * 8)]
    assert policy.plan(drafts, 8) == [(0, 4), (1, 4)]  # equal priors
    for _ in range(4):  # b's drafts are accepted, a's are not
        policy.on_step(StepReport((step("a", drafted=8, accepted=0), step("b", drafted=8, accepted=6)), 16, 6, 0.01))
    plan = policy.plan(drafts, 8)
    assert plan[0][0] == 1 and plan[0][1] >= 6 and sum(q for _, q in plan) == 8


# --- a third-party merge policy, as docs/combining.md writes it --------------------------------------------------------


def docs_policy_module():
    """The example of docs/combining.md, executed from the document itself."""
    text = (ROOT / "docs" / "combining.md").read_text()
    code = text.split("## Writing a merge policy")[1].split("```python\n")[1].split("```")[0]
    namespace: dict = {"__name__": "docs_policy"}
    exec(compile(code, "docs/combining.md", "exec", dont_inherit=True), namespace)  # (not this module's __future__)
    return type("DocsPolicy", (), {"specframe_register_merge_policies": staticmethod(
        namespace["specframe_register_merge_policies"])})()


def test_the_documented_merge_policy_plugin_works(envs):
    target, refs, _ = envs["llama"]
    reg = build_registry(extra_plugins=(docs_policy_module(),))
    assert "shortest-first" in reg.merge_policies
    sf = specframe.load(target=target, registry=reg, proposers=[{"name": "ngram", "k": 6}, {"name": "ngram", "k": 2}],
                        merge={"policy": "shortest-first", "max_nodes": 6})
    record = sf.generate(PROMPT, max_new_tokens=N_NEW)
    assert record["token_ids"] == refs[0][:N_NEW]
    with pytest.raises(ConfigError, match="shortest-first"):
        specframe.load(target=target, registry=reg, proposers=[{"name": "ngram"}, {"name": "none"}],
                       merge={"policy": "shortest-first", "width": 3})


def test_merge_policy_and_router_contracts_are_checked():
    from specframe.errors import PluginContractError

    class Plain(MergePolicyBase):
        name = "plain"  # MergePolicyBase's Config, MergePolicyConfig itself, is a valid config model

    class NoPlan:
        name = "no-plan"
        Config = MergePolicyConfig

        def start(self, proposers): ...

        def on_step(self, report): ...

    class NoneRouter(RouterBase):
        name = "none"

    class NoBatchRouter:  # a structural router (no RouterBase) from before ``on_batch`` was part of the contract
        name = "no-batch"
        Config = RouterConfig

        def start(self, proposers, seed, greedy): ...

        def route(self, budget, max_nodes, available): ...

        def revise(self, budget, max_nodes, available, drafts, budgets): ...

        def on_step(self, report): ...

    def plugin(hook, cls):
        return type("P", (), {hook: staticmethod(hookimpl(lambda register: register(cls)))})()

    assert build_registry(entry_points=False, extra_plugins=(
        plugin("specframe_register_merge_policies", Plain),)).merge_policies == {"plain": Plain}
    with pytest.raises(PluginContractError, match="method `plan` is missing"):
        build_registry(entry_points=False, extra_plugins=(plugin("specframe_register_merge_policies", NoPlan),))
    with pytest.raises(PluginContractError, match="'none' is reserved"):
        build_registry(entry_points=False, extra_plugins=(plugin("specframe_register_routers", NoneRouter),))
    with pytest.raises(PluginContractError, match="router 'no-batch' .* method `on_batch` is missing"):
        build_registry(entry_points=False, extra_plugins=(plugin("specframe_register_routers", NoBatchRouter),))


def test_one_proposer_needs_no_merge_policy_installed(envs, monkeypatch):
    from specframe.config import SpecframeConfig
    from specframe.registry import ALLOW_ENV

    target, refs, _ = envs["llama"]
    monkeypatch.setenv(ALLOW_ENV, "ngram")  # neither the merge policies nor the router are loaded
    sf = specframe.load(SpecframeConfig(proposers=[{"name": "ngram"}]), target=target)
    assert sf.generate(PROMPT, max_new_tokens=8)["token_ids"] == refs[0][:8]
    with pytest.raises(KeyError, match=r"unknown merge policy 'priority'; installed: \(none\)"):
        specframe.load(SpecframeConfig(proposers=[{"name": "ngram"}, {"name": "ngram", "k": 3}]), target=target)


def test_name_selects_a_merge_policy_and_the_old_policy_key_still_reads():
    """``merge: {name: ...}`` selects the policy, as ``name`` selects proposers and routers; ``policy:`` is read as
    ``name:`` (configs written before), and the two must agree when both are given."""
    from specframe.config import load_config, resolve_plugins
    from specframe.registry import build_registry

    reg = build_registry()
    two = [{"name": "ngram"}, {"name": "none"}]
    new = resolve_plugins(load_config(None, proposers=two, merge={"name": "confidence", "max_nodes": 9}), reg)
    old = resolve_plugins(load_config(None, proposers=two, merge={"policy": "confidence", "max_nodes": 9}), reg)
    assert new.merge == old.merge and new.merge[0].name == "confidence" and new.merge[1].max_nodes == 9
    assert load_config(None, merge="confidence").merge.name == "confidence"
    with pytest.raises(ConfigError, match="disagree"):
        load_config(None, proposers=two, merge={"name": "priority", "policy": "confidence"})
