"""Token trees: mask and positions, greedy and SpecInfer-style sampling over trees, KV compaction, and the
engine verifying branching drafts in one forward (exact against plain greedy)."""

from __future__ import annotations

import math
from typing import Literal

import pytest
import torch

from specframe import DraftTree, ProposerBase, ProposerConfig
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier, greedy_tree, sampling_tree
from specframe.decode.engine import Engine
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.target.kv_cache import cache_length, compact, new_cache
from specframe.token_tree import children_of, node_depths, tree_attention_mask, tree_position_ids

from tests.fakes import PROMPT, build_model, build_tokenizer, check_metrics, hf_greedy, test_device

pytestmark = pytest.mark.device_subset

DEV = test_device()  # the models, distributions and generators here live on the test device (--device)

#          root
#         /    \
#        0      2
#        |       \
#        1        3
#        |
#        4
PARENT = [-1, 0, -1, 2, 1]


def test_children_depths_positions():
    assert children_of(PARENT) == [[0, 2], [1], [4], [3], [], []]
    assert node_depths(PARENT) == [1, 2, 1, 2, 3]
    assert tree_position_ids(PARENT, 7).tolist() == [[7, 8, 9, 8, 9, 10]]


def test_tree_mask_rows_see_past_newest_and_ancestors_only():
    mask = tree_attention_mask(PARENT, past_len=2, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 2 + 6)
    seen = (mask[0, 0] == 0).int().tolist()
    #            past  newest  n0 n1 n2 n3 n4
    assert seen == [
        [1, 1, 1, 0, 0, 0, 0, 0],  # newest token: the past and itself
        [1, 1, 1, 1, 0, 0, 0, 0],  # node 0: + itself
        [1, 1, 1, 1, 1, 0, 0, 0],  # node 1: + node 0
        [1, 1, 1, 0, 0, 1, 0, 0],  # node 2: its own branch only
        [1, 1, 1, 0, 0, 1, 1, 0],  # node 3: + node 2
        [1, 1, 1, 1, 1, 0, 0, 1],  # node 4: nodes 0, 1
    ]
    assert (mask[0, 0][mask[0, 0] != 0] == torch.finfo(torch.float32).min).all()


@pytest.mark.parametrize(
    "argmax, path, nxt",
    [
        ([10, 11, 12, 0, 0, 14], [0, 1, 4], 14),  # first branch all the way: bonus after node 4
        ([20, 0, 0, 21, 99, 0], [2, 3], 99),  # second sibling matches, then its child; bonus after node 3
        ([20, 0, 0, 5, 0, 0], [2], 5),  # second sibling, child rejected: recovered = argmax after node 2
        ([7, 0, 0, 0, 0, 0], [], 7),  # no child matches the root's argmax
    ],
)
def test_greedy_tree(argmax, path, nxt):
    tokens = [10, 11, 20, 21, 12]
    assert greedy_tree(argmax, tokens, PARENT) == (path, nxt)


def _tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    emp = torch.bincount(samples, minlength=probs.numel()).double() / samples.numel()
    return 0.5 * float((emp - probs.double().cpu()).abs().sum())


def _first_tokens(sampler, p, q, tree_parent, n, seed, one_hot_tokens=None):
    """First emitted token of n verifications; every row of the target distribution is p (context-free)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    num = len(tree_parent)
    target = p.expand(num + 1, -1).contiguous()
    firsts = []
    for _ in range(n):
        if one_hot_tokens is not None:
            tokens, dprobs = one_hot_tokens, None
        else:
            tokens = torch.multinomial(q, num, replacement=True, generator=g).tolist()
            dprobs = q.expand(num, -1)
        path, nxt = sampler(target, dprobs, tokens, tree_parent, g)
        firsts.append(tokens[path[0]] if path else nxt)
    return torch.tensor(firsts)


def _no_residual_update(target_probs, draft_probs, tokens, parent, generator):
    """A buggy sampler: siblings are tested against the *original* p instead of the updated residual."""
    kids = children_of(parent)
    p = target_probs[0]
    for c in kids[0]:
        q = draft_probs[c]
        x = tokens[c]
        if float(torch.rand((), generator=generator, device=p.device)) * float(q[x]) < float(p[x]):
            return [c], 0
    residual = (p - draft_probs[kids[0][-1]]).clamp_min(0)
    return [], int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


V, N = 6, 30000
THRESHOLD = math.sqrt(V / N)
P = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05], device=DEV)
Q = torch.tensor([0.3, 0.1, 0.3, 0.1, 0.1, 0.1], device=DEV)
SIBLINGS = [-1, -1, -1, 0]  # three i.i.d. siblings at the root, one grandchild


def test_sampling_tree_first_token_is_target_distributed():
    assert _tv(_first_tokens(sampling_tree, P, Q, SIBLINGS, N, 0), P) < THRESHOLD


def test_sampling_tree_duplicate_one_hot_siblings_stay_exact():
    # deterministic siblings with the same token twice: the second must never be accepted after the first fails
    firsts = _first_tokens(sampling_tree, P, None, [-1, -1, -1], N, 1, one_hot_tokens=[3, 3, 1])
    assert _tv(firsts, P) < THRESHOLD


def test_the_tree_test_has_power_against_a_missing_residual_update():
    assert _tv(_first_tokens(_no_residual_update, P, Q, SIBLINGS, N, 2), P) > 3 * THRESHOLD


@pytest.mark.parametrize("path", [[0, 1, 4], [2, 3], [2], []])
def test_compaction_equals_fresh_prefill_of_the_accepted_path(path):
    model = build_model("llama")
    tokens = [10, 11, 20, 21, 12]
    prompt = PROMPT
    with torch.inference_mode():
        cache = new_cache(model.config)
        model(input_ids=torch.tensor([prompt[:-1]], device=DEV), cache=cache, use_cache=True)
        past = cache_length(cache)
        ids = torch.tensor([[prompt[-1], *tokens]], device=DEV)
        mask = tree_attention_mask(PARENT, past, torch.float32, DEV)
        pos = tree_position_ids(PARENT, past, DEV)
        model(input_ids=ids, cache=cache, use_cache=True, attention_mask=mask, position_ids=pos)
        compact(cache, past + 1, path)
        fresh = new_cache(model.config)
        model(input_ids=torch.tensor([prompt + [tokens[i] for i in path]], device=DEV), cache=fresh, use_cache=True)
    assert cache_length(cache) == cache_length(fresh) == len(prompt) + len(path)
    for a, b in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)


class TreeConfig(ProposerConfig):
    name: Literal["scripted-tree"] = "scripted-tree"


class ScriptedTree(ProposerBase):
    """Drafts a 2-branch tree: a wrong branch first, the reference continuation second (then wrong again)."""

    name = "scripted-tree"
    Config = TreeConfig
    produces_trees = True

    def __init__(self, reference: list[int], target) -> None:
        super().__init__(TreeConfig(), target)
        self.reference = reference

    def propose(self, state, budget):
        done = state.num_generated
        good = self.reference[done : done + 3]
        if len(good) < 3:
            return DraftTree.empty()
        bad = [(t + 1) % 64 for t in good]
        # nodes: bad0, bad1 (child of bad0), good0, good1, good2 (chain under good0), bad2 (child of good1)
        ids = torch.tensor([[bad[0], bad[1], good[0], good[1], good[2], bad[2]]])
        parent = torch.tensor([[-1, 0, -1, 2, 3, 3]])
        return DraftTree(ids, parent, None)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_tree_greedy_equals_plain_greedy(arch):
    model = build_model(arch)
    target = Target(model, build_tokenizer())
    ref = hf_greedy(model, PROMPT, 24)
    engine = Engine(target, [ScriptedTree(ref, target.info)], GreedyVerifier())
    res = engine.generate(PROMPT, max_new_tokens=24)
    assert res.token_ids == ref
    assert res.metrics.proposer_faults == 0
    assert res.metrics.tau > 2.5  # the second branch is accepted 3 deep each step
    check_metrics(res)
    assert len(res.metrics.drafted_by_depth) == 3  # counted by depth: the tree is 3 deep, 6 nodes wide


def test_engine_tree_sampling_is_seeded_and_fault_free():
    model = build_model("llama")
    target = Target(model, build_tokenizer())
    ref = hf_greedy(model, PROMPT, 16)
    engine = Engine(target, [ScriptedTree(ref, target.info)], SpeculativeSamplingVerifier())
    runs = [engine.generate(PROMPT, max_new_tokens=16, sampling=SamplingParams(temperature=1.0), seed=s)
            for s in (3, 3, 4)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids
    assert all(r.metrics.proposer_faults == 0 for r in runs)


def test_sliding_window_target_verifies_the_leading_chain_of_tree_drafts():
    model = build_model("qwen2-sliding")
    target = Target(model, build_tokenizer())
    assert not target.supports_trees
    ref = hf_greedy(model, PROMPT, 12)
    res = Engine(target, [ScriptedTree(ref, target.info)], GreedyVerifier()).generate(PROMPT, max_new_tokens=12)
    assert res.token_ids == ref
    # a proposer that declares trees is not at fault where only chains can be verified: its leading chain (the
    # first branch, bad0 -> bad1) is verified instead of the tree
    assert res.metrics.proposer_faults == 0
    assert res.metrics.drafted_by_depth[0] == res.metrics.drafted_by_depth[1] > 0
    assert len(res.metrics.drafted_by_depth) == 2 and res.metrics.accepted_nodes == 0  # (that branch is wrong)
    check_metrics(res)


def test_leading_chain():
    tree = DraftTree(torch.tensor([[7, 8, 9, 10, 11]]), torch.tensor([PARENT]))
    assert tree.leading_chain().token_ids.tolist() == [[7, 8]]
    chain = DraftTree.chain([1, 2, 3])
    assert chain.leading_chain() is chain
    assert DraftTree.empty().leading_chain().num_nodes == 0
    assert DraftTree(torch.tensor([[1, 2]]), torch.tensor([[-1, -1]])).leading_chain().token_ids.tolist() == [[1]]


_COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=0)


def _config(kind: str):
    import transformers as tf

    return {
        "llama": lambda: tf.LlamaConfig(**_COMMON),
        "mistral-no-window": lambda: tf.MistralConfig(**_COMMON, sliding_window=None),
        "qwen2-window-off": lambda: tf.Qwen2Config(**_COMMON, sliding_window=8),
        "qwen3": lambda: tf.Qwen3Config(**_COMMON),
        "mistral": lambda: tf.MistralConfig(**_COMMON, sliding_window=8),  # no layer_types: inferred
        "mixtral": lambda: tf.MixtralConfig(**_COMMON, sliding_window=8),
        "phi3": lambda: tf.Phi3Config(**_COMMON, sliding_window=8),
        "starcoder2": lambda: tf.Starcoder2Config(**_COMMON, sliding_window=8),
        "qwen2-window-on": lambda: tf.Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=8,
                                                  max_window_layers=1),
        "gemma3": lambda: tf.Gemma3TextConfig(**_COMMON, sliding_window=8),
        "gpt-oss": lambda: tf.GptOssConfig(**_COMMON, sliding_window=8),
        "llama4-chunked": lambda: tf.Llama4TextConfig(**_COMMON, attention_chunk_size=8),
    }[kind]()


@pytest.mark.parametrize("kind,trees", [
    ("llama", True), ("mistral-no-window", True), ("qwen2-window-off", True), ("qwen3", True),
    ("mistral", False), ("mixtral", False), ("phi3", False), ("starcoder2", False), ("qwen2-window-on", False),
    ("gemma3", False), ("gpt-oss", False), ("llama4-chunked", False),
])
def test_tree_support_follows_the_attention_transformers_gives_each_layer(kind, trees):
    from specframe.target.hf import tree_obstacle

    assert (tree_obstacle(_config(kind)) is None) == trees


def _mistral(window: int = 8):
    from transformers import MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(_config("mistral")).float().eval()
    model.generation_config.eos_token_id = None
    return model.to(DEV)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ngram_branches_on_a_sliding_window_mistral(temperature):
    """The issue's case: a Mistral-style config (sliding_window 8, no layer_types), an 11-token prompt and
    ``{name: ngram, branches: 4}`` crashed the request; now its drafts are verified as chains, exactly."""
    from specframe_plugins.ngram import NgramConfig, NgramProposer

    model = _mistral()
    target = Target(model, build_tokenizer())
    assert not target.supports_trees and not target.info.supports_trees
    sampling = SamplingParams(temperature=temperature)
    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    res = Engine(target, [NgramProposer(NgramConfig(branches=4), target.info)], verifier).generate(
        PROMPT, max_new_tokens=40, sampling=sampling, seed=3)
    assert len(PROMPT) == 11 and res.finish_reason == "length"
    assert res.metrics.proposer_faults == 0 and res.metrics.accepted_nodes > 0
    if sampling.is_greedy:
        assert res.token_ids == hf_greedy(model, PROMPT, 40)
        check_metrics(res)


class _Refusing:
    """Makes the target's last decoder layer raise, after the prefill, on inputs of more than ``limit`` positions (or,
    with ``limit`` None, on a tree mask): a shape its attention cannot take. The layers before it have grown the
    KV cache by then."""

    def __init__(self, target, limit: int | None = None) -> None:
        self.target, self.limit = target, limit
        self.layer = target.model.model.layers[-1]
        self.refused = self.calls = 0
        self.tree = False

    def __enter__(self):
        inner_layer, inner_forward = self.layer.forward, self.target.forward_features

        def layer_forward(hidden_states, *args, **kwargs):
            self.calls += 1
            too_long = self.limit is not None and hidden_states.shape[1] > self.limit
            if self.calls > 1 and (too_long or (self.limit is None and self.tree)):
                self.refused += 1
                raise RuntimeError("this attention cannot take that input")
            return inner_layer(hidden_states, *args, **kwargs)

        def forward_features(*args, **kwargs):
            self.tree = kwargs.get("attention_mask") is not None or (len(args) > 5 and args[5] is not None)
            return inner_forward(*args, **kwargs)

        self.layer.forward, self.target.forward_features = layer_forward, forward_features
        return self

    def __exit__(self, *exc):
        del self.layer.forward, self.target.forward_features


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding"])
@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_a_draft_the_target_refuses_is_not_a_crash(arch, shape, caplog):
    """A target forward that raises on a draft's shape: the KV cache is restored, the step goes on without the
    draft, and the request continues — chains only after a refused tree, no drafts after a refused chain."""
    model = build_model(arch)
    target = Target(model, build_tokenizer())
    target.supports_trees = True  # as if the check had missed an attention kind
    ref = hf_greedy(model, PROMPT, 24)
    proposer = ScriptedTree(ref, target.info)
    if shape == "chain":
        from specframe_plugins.ngram import NgramConfig, NgramProposer

        proposer = NgramProposer(NgramConfig(), target.info)
    with _Refusing(target, limit=None if shape == "tree" else 2) as refusing:
        res = Engine(target, [proposer], GreedyVerifier()).generate(PROMPT, max_new_tokens=24)
    assert refusing.refused == 1
    assert res.token_ids == ref
    m = res.metrics
    assert m.proposer_fault_kinds == {"refused": 1} and m.proposer_faults == 1
    if shape == "tree":  # chains from then on: the leading (wrong) branch is drafted and rejected
        assert m.drafted_nodes > 0
    else:
        assert m.drafted_nodes == 0
    assert sum(1 for r in caplog.records if "target's forward raised" in r.getMessage()) == 1


def test_a_target_that_fails_without_a_draft_still_raises():
    model = build_model("llama")
    target = Target(model, build_tokenizer())
    from specframe_plugins.autoregressive import NoneConfig, NoProposer

    with _Refusing(target, limit=0), pytest.raises(RuntimeError, match="cannot take"):
        Engine(target, [NoProposer(NoneConfig(), target.info)], GreedyVerifier()).generate(PROMPT, max_new_tokens=4)
