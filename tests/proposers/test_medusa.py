"""The ``medusa`` proposer (plugins/medusa.py): best-first tree growth over per-head candidates, the heads format
(specframe.learned.medusa_heads), exactness through the engine on tiny random targets (trees on full-attention
targets, chains on sliding-window ones), deterministic drafts under sampling, errors, and the conformance kit."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from specframe import DecodeState
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned.medusa_heads import MedusaHeads
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.testing import Kit, NotApplicable
from specframe.testing.calls import CallLog
from specframe.testing.tiny import last_hidden
from specframe.token_tree import node_depths
from specframe_plugins.medusa import MedusaConfig, MedusaProposer, grow_tree

from tests.fakes import (
    ARCHS,
    HIDDEN,
    NAME,
    PROMPT,
    PROMPT_2,
    build_model,
    build_tokenizer,
    check_metrics,
    hf_greedy,
    random_heads,
)

pytestmark = pytest.mark.device_subset

N_NEW = 40


# --- helpers --------------------------------------------------------------------------------------------------------


def forced_heads(lm_head_weight: torch.Tensor, dims: list[int], scale: float = 1e4) -> tuple[MedusaHeads, list[int]]:
    """Heads whose head ``d`` proposes one known token whatever the hidden state.

    Head ``d`` has W = 0 and bias ``scale * e_{dims[d]}``, so it adds ``SiLU(scale) * e_{dims[d]}`` to the hidden
    state and the LM head's logits become ``W_lm h + SiLU(scale) * W_lm[:, dims[d]]``: for a large scale the
    argmax is ``argmax_j W_lm[j, dims[d]]``, whatever ``h`` is. Returns the heads and those tokens.
    """
    heads = MedusaHeads(lm_head_weight.shape[1], len(dims), 1)
    with torch.no_grad():
        for d, dim in enumerate(dims):
            heads.heads[d][0].linear.bias[dim] = scale
    tokens = [int(lm_head_weight[:, dim].argmax()) for dim in dims]
    return heads, tokens


def reference_head_probs(heads: MedusaHeads, lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``[D, V]``: the Medusa-1 formula written out independently: x <- x + SiLU(W x + b) per block, then the LM
    head and a softmax. Computed on the CPU (where the heads built here live), whatever the target's device."""
    rows = []
    with torch.no_grad():
        for head in heads.heads:
            x = hidden.reshape(-1).double().cpu()
            for block in head:
                w, b = block.linear.weight.double(), block.linear.bias.double()
                x = x + torch.nn.functional.silu(w @ x + b)
            rows.append(torch.softmax(lm_head.weight.double().cpu() @ x, -1))
    return torch.stack(rows)


def state_for(target: Target, tokens: list[int], prompt_len: int | None = None,
              sampling: SamplingParams = SamplingParams(), seed: int = 0) -> DecodeState:
    """What the engine hands the proposer after committing ``tokens`` (hidden = last processed position)."""
    return DecodeState(torch.tensor([tokens]), prompt_len or len(tokens), sampling,
                       torch.Generator(device=target.device).manual_seed(seed), last_hidden(target, tokens))


@pytest.fixture(scope="module")
def targets():
    return {arch: Target(build_model(arch), build_tokenizer(), name=NAME) for arch in ARCHS}


@pytest.fixture(scope="module")
def references(targets):
    return {(arch, i): hf_greedy(t.model, p, N_NEW) for arch, t in targets.items() for i, p in
            enumerate((PROMPT, PROMPT_2))}


@pytest.fixture(scope="module")
def heads_dirs(tmp_path_factory):
    """name -> folder of saved heads (hidden size 32, as the tiny targets)."""
    root = tmp_path_factory.mktemp("medusa")
    out = {}
    for name, heads in {
        "random": random_heads(4, 1, seed=0),
        "random2": random_heads(3, 2, std=0.3, seed=0),
        "zero": MedusaHeads(HIDDEN, 4, 1),
    }.items():
        heads.save(root / name, NAME)
        out[name] = root / name
    return out


def medusa(target: Target, heads: Path, **options) -> MedusaProposer:
    return MedusaProposer(MedusaConfig(heads=str(heads), **options), target.info)


# --- grow_tree ------------------------------------------------------------------------------------------------------


def test_grow_tree_hand_computed_example():
    # depth 0: 10 (0.6), 11 (0.4); depth 1: 20 (0.7), 21 (0.3); depth 2: 30 (0.9), 31 (0.1)
    # scores: 10: .6 | 10-20: .42 | 11: .4 | 10-20-30: .378 | 11-20: .28 | 11-20-30: .252 | 10-21: .18 | ...
    ids, parents = grow_tree([[10, 11], [20, 21], [30, 31]], [[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]], 7)
    assert ids == [10, 20, 11, 30, 20, 30, 21]
    assert parents == [-1, 0, -1, 1, 2, 4, 0]
    # the budget keeps the best prefix
    assert grow_tree([[10, 11], [20, 21], [30, 31]], [[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]], 3) == (
        [10, 20, 11], [-1, 0, -1])
    assert grow_tree([[10, 11]], [[0.6, 0.4]], 1) == ([10], [-1])
    # one depth only: the roots, best first, and never more nodes than exist
    assert grow_tree([[10, 11]], [[0.6, 0.4]], 16) == ([10, 11], [-1, -1])


@pytest.mark.parametrize("seed", range(12))
def test_grow_tree_takes_the_best_paths_in_topological_order(seed):
    rng = random.Random(seed)
    depth, k = rng.randint(1, 4), rng.randint(1, 4)
    max_nodes = rng.randint(1, 40)
    # distinct ids per depth (id = 100 d + rank) so each node's depth and rank can be read back from its token
    top_ids = [[100 * d + r for r in range(k)] for d in range(depth)]
    top_probs = [sorted((rng.random() for _ in range(k)), reverse=True) for _ in range(depth)]
    ids, parents = grow_tree(top_ids, top_probs, max_nodes)

    total = sum(k ** (d + 1) for d in range(depth))
    assert len(ids) == len(parents) == min(max_nodes, total)
    depths = node_depths(parents)
    scores = []
    for i, (tok, par) in enumerate(zip(ids, parents)):
        assert -1 <= par < i  # topological
        d, r = divmod(tok, 100)
        assert d == depths[i] - 1  # depth d uses head d's candidates
        assert r < k
        scores.append(top_probs[d][r] * (scores[par] if par >= 0 else 1.0))
    # no duplicated path: (parent, token) pairs are unique
    assert len(set(zip(parents, ids))) == len(ids)
    # nodes come out by descending path score
    assert all(a >= b for a, b in zip(scores, scores[1:]))
    # and the set taken is the best one: no path left out scores higher than the worst taken
    every = [math.prod(top_probs[d][r] for d, r in enumerate(path))
             for n in range(1, depth + 1) for path in itertools.product(range(k), repeat=n)]
    every.sort(reverse=True)
    assert scores == pytest.approx(every[: len(ids)])


# --- greedy exactness through the engine ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("heads, top_k, max_nodes", [("random", 4, 16), ("random", 2, 5), ("random2", 3, 32),
                                                     ("zero", 4, 8)])
def test_greedy_trees_equal_plain_greedy(targets, references, heads_dirs, arch, heads, top_k, max_nodes):
    target = targets[arch]
    rec = CallLog(medusa(target, heads_dirs[heads], top_k=top_k, max_nodes=max_nodes), target.vocab_size)
    engine = Engine(target, [rec], GreedyVerifier())
    num_heads = rec.inner.num_heads
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == references[(arch, i)]
        check_metrics(res)
        m = res.metrics
        assert m.drafted_nodes > m.target_forwards  # more than one node a step: trees were drafted
        assert len(m.drafted_by_depth) <= num_heads  # never deeper than the heads
    assert not rec.problems
    drafts = rec.drafts()
    assert drafts and all(d.num_nodes <= max_nodes for d in drafts)
    assert any(not d.is_chain() for d in drafts)  # the engine verified branching drafts
    assert all(d.draft_probs is None for d in drafts)


def test_zero_init_heads_get_repeats_accepted(targets, references, heads_dirs):
    """Untrained (zero) heads predict what the LM head predicts from the same hidden state: the token the target
    just committed. llama's greedy continuation of PROMPT_2 repeats one token 20 times, so those drafts pass."""
    target = targets["llama"]
    ref = references[("llama", 1)]
    assert ref[:20] == [ref[0]] * 20
    res = Engine(target, [medusa(target, heads_dirs["zero"], top_k=2, max_nodes=8)], GreedyVerifier()).generate(
        PROMPT_2, max_new_tokens=N_NEW)
    assert res.token_ids == ref
    check_metrics(res)
    assert res.metrics.accepted_nodes >= 10
    assert res.metrics.tau > 1.4


def test_sliding_window_target_gets_chains_without_faults(targets, references, heads_dirs):
    target = targets["qwen2-sliding"]
    assert target.info.supports_trees is False
    rec = CallLog(medusa(target, heads_dirs["random"], top_k=4, max_nodes=16), target.vocab_size)
    engine = Engine(target, [rec], GreedyVerifier())
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == references[("qwen2-sliding", i)]
        assert res.metrics.proposer_faults == 0
        check_metrics(res)
        assert res.metrics.drafted_nodes > 0
    assert not rec.problems
    drafts = rec.drafts()
    assert drafts and all(d.is_chain() and 1 <= d.num_nodes <= 4 for d in drafts)  # top-1 of each of 4 heads
    assert any(d.num_nodes == 4 for d in drafts)


class HiddenChecked(MedusaProposer):
    """Checks at every propose that the engine's hidden state is the target's last hidden state at the position
    before the newest committed token (after tree verification and KV compaction); a failed assertion is a
    proposer fault, which check_metrics reports."""

    def __init__(self, config, info, target):
        super().__init__(config, info)
        self.full_target, self.checked, self.calls = target, 0, 0

    def propose(self, state, budget):
        self.calls += 1
        expected = last_hidden(self.full_target, state.tokens[0].tolist())
        if expected is None:
            assert state.hidden is None
        else:
            torch.testing.assert_close(state.hidden, expected, atol=1e-4, rtol=1e-4)
            self.checked += 1
        return super().propose(state, budget)


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding"])
def test_hidden_state_follows_the_accepted_path(targets, references, heads_dirs, arch):
    target = targets[arch]
    prop = HiddenChecked(MedusaConfig(heads=str(heads_dirs["zero"]), top_k=3, max_nodes=10), target.info, target)
    res = Engine(target, [prop], GreedyVerifier()).generate(PROMPT_2, max_new_tokens=N_NEW)
    assert res.token_ids == references[(arch, 1)]
    check_metrics(res)
    # every step but (perhaps) the last, whose budget is 0, was checked
    assert prop.checked == prop.calls >= res.metrics.target_forwards - 1
    if arch == "llama":
        assert res.metrics.accepted_nodes > 0  # hidden states of accepted tree nodes were handed on


def test_one_token_prompt_has_no_hidden_state_at_first(targets, heads_dirs):
    target = targets["llama"]
    prompt = [PROMPT[0]]
    rec = CallLog(medusa(target, heads_dirs["random"], top_k=3, max_nodes=8), target.vocab_size)
    res = Engine(target, [rec], GreedyVerifier()).generate(prompt, max_new_tokens=20)
    assert res.token_ids == hf_greedy(target.model, prompt, 20)
    check_metrics(res)
    sizes = [d.num_nodes for d in rec.drafts()]
    assert sizes[0] == 0 and all(n > 0 for n in sizes[1:])  # nothing to draft from until the first forward


# --- what the heads propose -----------------------------------------------------------------------------------------


def test_zero_heads_propose_the_lm_heads_top_tokens_at_depth_one(targets, references, heads_dirs):
    target = targets["llama"]
    tokens = PROMPT + references[("llama", 0)][:6]
    state = state_for(target, tokens, len(PROMPT))
    prop = medusa(target, heads_dirs["zero"], top_k=4, max_nodes=4)
    draft = prop.propose(state, 16)
    with torch.no_grad():
        p = torch.softmax(target.model.lm_head(state.hidden[0]), -1)
    top = p.topk(4).indices.tolist()
    # the hidden state that produced the newest (greedy) token: the LM head's argmax is that token
    assert top[0] == tokens[-1]
    ids, parents = draft.token_ids[0].tolist(), draft.parent[0].tolist()
    # the logits are near uniform (p1 ** 2 << p4), so the four roots come before any child
    assert parents == [-1, -1, -1, -1]
    assert ids == top
    # a bigger budget adds depth-2 nodes from the (identical) next head: the best one is top-1 after top-1
    draft = medusa(target, heads_dirs["zero"], top_k=4, max_nodes=8).propose(state, 16)
    assert draft.token_ids[0, :4].tolist() == top
    assert draft.token_ids[0, 4].item() == top[0] and draft.parent[0, 4].item() == 0
    assert all(0 <= par < 4 for par in draft.parent[0, 4:].tolist())
    assert set(draft.token_ids[0, 4:].tolist()) <= set(top)


@pytest.mark.parametrize("num_heads", [None, 2])
def test_tree_matches_an_independent_implementation_of_the_heads(targets, references, heads_dirs, num_heads):
    target = targets["qwen2"]
    heads = MedusaHeads.load(heads_dirs["random2"], HIDDEN)  # 3 heads of 2 random blocks
    tokens = PROMPT + references[("qwen2", 0)][:9]
    state = state_for(target, tokens, len(PROMPT))
    prop = medusa(target, heads_dirs["random2"], top_k=3, max_nodes=20, num_heads=num_heads)
    draft = prop.propose(state, 20)
    probs = reference_head_probs(heads, target.model.lm_head, state.hidden)[: num_heads or 3]
    p, i = probs.topk(3, -1)
    ids, parents = grow_tree(i.tolist(), p.tolist(), 20)
    assert draft.token_ids[0].tolist() == ids
    assert draft.parent[0].tolist() == parents
    assert max(node_depths(parents)) == (num_heads or 3)
    # the random heads disagree with each other: the tree has structure, not the same token at every depth
    assert len(set(i[:, 0].tolist())) > 1
    # the budget from the engine caps the tree as well as max_nodes does
    small = prop.propose(state, 5)
    assert small.token_ids[0].tolist() == ids[:5] and small.parent[0].tolist() == parents[:5]


def test_head_d_drafts_depth_d_plus_one(targets, tmp_path):
    """Heads forced to known tokens (see forced_heads): the top path of the tree is head 0's token, then head 1's,
    ..., i.e. head d feeds depth d + 1; on a sliding-window target the chain is the same top-1 tokens."""
    for arch in ("llama", "qwen2-sliding"):
        target = targets[arch]
        w = target.model.lm_head.weight.detach()
        # four hidden dims whose forced tokens are distinct
        chosen, seen = [], set()
        for d, t in enumerate(w.argmax(0).tolist()):
            if t not in seen:
                chosen.append(d)
                seen.add(t)
            if len(chosen) == 4:
                break
        heads, expected = forced_heads(w, chosen)
        heads.save(tmp_path / arch, NAME)
        prop = medusa(target, tmp_path / arch, top_k=3, max_nodes=4)
        state = state_for(target, PROMPT)
        draft = prop.propose(state, 8)
        assert draft.token_ids[0].tolist() == expected
        assert draft.parent[0].tolist() == [-1, 0, 1, 2]
        # whatever the context (hidden state) is
        assert prop.propose(state_for(target, PROMPT_2), 8).token_ids[0].tolist() == expected


def test_no_hidden_state_means_no_draft(targets, heads_dirs):
    target = targets["llama"]
    prop = medusa(target, heads_dirs["random"])
    state = DecodeState(torch.tensor([[5]]), 1, SamplingParams(), torch.Generator(device=target.device), None)
    assert prop.propose(state, 8).num_nodes == 0


def test_budget_one_and_top_k_one_draft_chains(targets, heads_dirs):
    target = targets["llama"]
    state = state_for(target, PROMPT)
    heads = MedusaHeads.load(heads_dirs["random"], HIDDEN)
    top1 = reference_head_probs(heads, target.model.lm_head, state.hidden).argmax(-1).tolist()
    one = medusa(target, heads_dirs["random"], top_k=4, max_nodes=16).propose(state, 1)
    assert one.token_ids[0].tolist() == top1[:1]
    chain = medusa(target, heads_dirs["random"], top_k=1, max_nodes=16).propose(state, 16)
    assert chain.is_chain() and chain.token_ids[0].tolist() == top1


def test_top_k_above_the_vocabulary(specframe_tiny_target, tmp_path):
    target = specframe_tiny_target  # V = 16
    random_heads(2, hidden=int(target.model.get_output_embeddings().weight.shape[1])).save(tmp_path, target.name)
    prop = MedusaProposer(MedusaConfig(heads=str(tmp_path), top_k=20, max_nodes=8), target.info)
    draft = prop.propose(state_for(target, [1, 2, 3, 4]), 8)
    assert draft.num_nodes == 8


# --- sampling -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=1.0),
                                      SamplingParams(temperature=0.8, top_k=10, top_p=0.9)])
def test_sampling_is_seeded_fault_free_and_drafts_are_deterministic(targets, heads_dirs, sampling):
    target = targets["qwen2"]
    rec = CallLog(medusa(target, heads_dirs["random"], top_k=3, max_nodes=12), target.vocab_size)
    engine = Engine(target, [rec], SpeculativeSamplingVerifier())
    runs = [engine.generate(PROMPT, max_new_tokens=24, sampling=sampling, seed=s) for s in (3, 3, 4)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids
    for r in runs:
        check_metrics(r)
        assert r.metrics.drafted_nodes > 0
    assert not rec.problems
    assert MedusaProposer.provides_draft_probs is False
    assert all(d.draft_probs is None for d in rec.drafts())
    # a draft depends on the committed tokens only, not on the request's random state
    state_a = state_for(target, PROMPT, sampling=sampling, seed=1)
    state_b = state_for(target, PROMPT, sampling=sampling, seed=2)
    a, b = rec.inner.propose(state_a, 12), rec.inner.propose(state_b, 12)
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.parent, b.parent)
    # and sampling drafts the same tree as greedy decoding
    g = rec.inner.propose(state_for(target, PROMPT), 12)
    assert torch.equal(a.token_ids, g.token_ids) and torch.equal(a.parent, g.parent)


# --- errors ---------------------------------------------------------------------------------------------------------


def test_load_refuses_a_folder_without_heads(tmp_path):
    with pytest.raises(ConfigError, match=r"holds no Medusa heads \(needs medusa\.json and medusa\.safetensors\)"):
        MedusaHeads.load(tmp_path, HIDDEN)
    random_heads(2).save(tmp_path / "h", NAME)
    (tmp_path / "h" / "medusa.safetensors").unlink()  # the json alone is not enough
    with pytest.raises(ConfigError, match="holds no Medusa heads"):
        MedusaHeads.load(tmp_path / "h", HIDDEN)


def test_load_refuses_another_hidden_size(tmp_path):
    random_heads(2, hidden=16).save(tmp_path, NAME)
    with pytest.raises(ConfigError) as err:
        MedusaHeads.load(tmp_path, HIDDEN)
    msg = str(err.value)
    assert "hidden size 16" in msg and f"the target's is {HIDDEN}" in msg and "specframe train medusa" in msg


def test_load_refuses_another_format(tmp_path):
    random_heads(2).save(tmp_path, NAME)
    meta = json.loads((tmp_path / "medusa.json").read_text())
    meta["format"] = 99
    (tmp_path / "medusa.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"format 99, this specframe reads format 1"):
        MedusaHeads.load(tmp_path, HIDDEN)


def test_save_load_round_trip(tmp_path):
    heads = random_heads(3, 2, seed=5)
    heads.save(tmp_path, NAME)
    meta = json.loads((tmp_path / "medusa.json").read_text())
    assert meta == {"format": 1, "hidden_size": HIDDEN, "num_heads": 3, "num_layers": 2, "target": NAME}
    loaded = MedusaHeads.load(tmp_path, HIDDEN)
    assert not loaded.training
    x = torch.randn(2, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), heads(x))
        assert loaded(x).shape == (2, 3, HIDDEN)


def test_zero_heads_are_the_identity():
    heads = MedusaHeads(HIDDEN, 3, 2)
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        assert torch.equal(heads(x), x[:, None].expand(5, 3, HIDDEN))


def test_proposer_without_heads_for_an_unknown_target(targets):
    with pytest.raises(ConfigError) as err:
        MedusaProposer(MedusaConfig(), targets["llama"].info)
    msg = str(err.value)
    assert repr(NAME) in msg and "specframe train medusa" in msg and "heads: DIR" in msg


def test_proposer_with_a_bad_heads_folder(targets, tmp_path):
    with pytest.raises(ConfigError, match="holds no Medusa heads"):
        MedusaProposer(MedusaConfig(heads=str(tmp_path)), targets["llama"].info)
    random_heads(2, hidden=16).save(tmp_path / "small", NAME)
    with pytest.raises(ConfigError, match="hidden size 16"):
        MedusaProposer(MedusaConfig(heads=str(tmp_path / "small")), targets["llama"].info)


def test_proposer_needs_the_target_model(targets, heads_dirs):
    from dataclasses import replace

    info = replace(targets["llama"].info, model=None)
    with pytest.raises(ConfigError, match="needs the target model"):
        MedusaProposer(MedusaConfig(heads=str(heads_dirs["random"])), info)


@pytest.mark.parametrize("bad", [{"top_k": 0}, {"top_k": 33}, {"max_nodes": 0}, {"max_nodes": 257},
                                 {"num_heads": 0}, {"unknown": 1}])
def test_config_validation(bad):
    with pytest.raises(ValidationError):
        MedusaConfig(**bad)


def test_num_heads_above_the_trained_heads_uses_them_all(targets, heads_dirs):
    prop = medusa(targets["llama"], heads_dirs["random2"], num_heads=10)
    assert prop.num_heads == 3


# --- a frequent-token subset of the vocabulary (FR-Spec) -------------------------------------------------------------


def subset_probs(heads: MedusaHeads, lm_head: nn.Module, hidden: torch.Tensor, token_map: list[int]) -> torch.Tensor:
    """``[D, S]``: the reference heads' distributions over the subset only (softmax of the subset's logits)."""
    p = reference_head_probs(heads, lm_head, hidden)[:, token_map]
    return p / p.sum(-1, keepdim=True)


def test_save_load_round_trip_with_a_token_map(tmp_path):
    import safetensors.torch

    token_map = torch.tensor([2, 3, 7, 11, 40, 63], dtype=torch.int32)
    heads = random_heads(2, 1, seed=3, token_map=token_map)
    assert heads.token_map.dtype == torch.int64  # stored as int64 whatever it was given as
    heads.save(tmp_path, NAME)
    meta = json.loads((tmp_path / "medusa.json").read_text())
    assert meta["vocab_subset"] == 6
    stored = safetensors.torch.load_file(str(tmp_path / "medusa.safetensors"))
    assert stored["specframe.token_map"].tolist() == [2, 3, 7, 11, 40, 63]
    loaded = MedusaHeads.load(tmp_path, HIDDEN)
    assert loaded.token_map.dtype == torch.int64 and torch.equal(loaded.token_map, token_map.long())
    assert "specframe.token_map" not in loaded.state_dict()  # not a parameter: (de)serialised on its own
    x = torch.randn(3, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), heads(x))
    # heads saved without a subset (older files too) load with none, and their json says nothing about one
    random_heads(2, 1, seed=3).save(tmp_path / "full", NAME)
    assert "vocab_subset" not in json.loads((tmp_path / "full" / "medusa.json").read_text())
    assert MedusaHeads.load(tmp_path / "full", HIDDEN).token_map is None


@pytest.mark.parametrize("arch", ["qwen2", "qwen2-sliding"])
def test_subset_heads_draft_only_subset_tokens(targets, references, tmp_path, arch):
    """The same heads with and without a subset that leaves out every token the full-vocabulary heads draft: the
    subset heads draft what an independent implementation restricted to the subset drafts (ids mapped back to the
    target's), all inside the subset; ``full_vocab: true`` drafts exactly what the heads without a subset draft."""
    target = targets[arch]
    random_heads(3, 2, seed=0).save(tmp_path / "full", NAME)
    state = state_for(target, PROMPT + references[(arch, 0)][:9], len(PROMPT))
    full = medusa(target, tmp_path / "full", top_k=3, max_nodes=12).propose(state, 12)
    outside = set(full.token_ids[0].tolist())
    token_map = [t for t in range(target.vocab_size) if t not in outside]
    heads = random_heads(3, 2, seed=0, token_map=torch.tensor(token_map))
    heads.save(tmp_path / "subset", NAME)

    prop = medusa(target, tmp_path / "subset", top_k=3, max_nodes=12)
    assert prop.token_map.tolist() == token_map
    draft = prop.propose(state, 12)
    assert draft.num_nodes == full.num_nodes and set(draft.token_ids[0].tolist()) <= set(token_map)
    sub = subset_probs(heads, target.model.lm_head, state.hidden, token_map)
    if target.info.supports_trees:
        p, i = sub.topk(3, -1)
        ids, parents = grow_tree([[token_map[r] for r in row] for row in i.tolist()], p.tolist(), 12)
        assert draft.token_ids[0].tolist() == ids and draft.parent[0].tolist() == parents
    else:  # a chain of each head's top-1 within the subset
        assert draft.token_ids[0].tolist() == [token_map[r] for r in sub.argmax(-1).tolist()]
    one = prop.propose(state, 1)  # the budget-1 chain path maps its ids back too
    assert one.token_ids[0].tolist() == [token_map[int(sub[0].argmax())]]

    everything = medusa(target, tmp_path / "subset", top_k=3, max_nodes=12, full_vocab=True)
    assert everything.token_map is None
    again = everything.propose(state, 12)
    assert torch.equal(again.token_ids, full.token_ids) and torch.equal(again.parent, full.parent)
    assert not set(again.token_ids[0].tolist()) & set(token_map)  # all outside the subset


@pytest.mark.parametrize("arch", ARCHS)
def test_subset_heads_keep_greedy_output_unchanged(targets, references, tmp_path, arch):
    target = targets[arch]
    token_map = list(range(0, target.vocab_size, 2))  # half the vocabulary
    random_heads(4, 1, seed=0, token_map=torch.tensor(token_map)).save(tmp_path, NAME)
    rec = CallLog(medusa(target, tmp_path, top_k=3, max_nodes=8), target.vocab_size)
    engine = Engine(target, [rec], GreedyVerifier())
    for i, prompt in enumerate((PROMPT, PROMPT_2)):
        res = engine.generate(prompt, max_new_tokens=N_NEW)
        assert res.token_ids == references[(arch, i)]
        check_metrics(res)
        assert res.metrics.drafted_nodes > res.metrics.target_forwards  # several nodes a step
    assert not rec.problems
    drafted = {t for d in rec.drafts() for t in d.token_ids[0].tolist()}
    assert drafted and drafted <= set(token_map)
    assert any(not d.is_chain() for d in rec.drafts()) == target.info.supports_trees


def test_zero_subset_heads_get_repeats_accepted(targets, references, tmp_path):
    """As test_zero_init_heads_get_repeats_accepted, with a small subset that holds the repeated token: the
    subset's ids must be mapped back to the target's for those drafts to pass."""
    target = targets["llama"]
    ref = references[("llama", 1)]
    assert ref[:20] == [ref[0]] * 20
    token_map = sorted({ref[0], 1, 2, 3, 4, 5})
    assert token_map.index(ref[0]) != ref[0]  # a subset index is not the token id
    MedusaHeads(HIDDEN, 4, 1, torch.tensor(token_map)).save(tmp_path, NAME)
    rec = CallLog(medusa(target, tmp_path, top_k=2, max_nodes=8), target.vocab_size)
    res = Engine(target, [rec], GreedyVerifier()).generate(PROMPT_2, max_new_tokens=N_NEW)
    assert res.token_ids == ref
    check_metrics(res)
    assert res.metrics.accepted_nodes >= 10
    assert {t for d in rec.drafts() for t in d.token_ids[0].tolist()} <= set(token_map)


def test_subset_scoring_adds_the_lm_heads_bias(tmp_path):
    """An LM head with a bias: the subset's logits are its weight rows times the features plus its bias rows."""
    model = build_model("llama")
    head = nn.Linear(HIDDEN, model.config.vocab_size, bias=True, device=model.device)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.copy_(torch.randn(head.bias.shape, generator=torch.Generator().manual_seed(0)) * 5)
    model.lm_head = head
    target = Target(model, build_tokenizer(), name=NAME)
    token_map = list(range(1, model.config.vocab_size, 3))
    heads = random_heads(3, 1, seed=1, token_map=torch.tensor(token_map))
    heads.save(tmp_path, NAME)
    state = state_for(target, PROMPT)
    draft = medusa(target, tmp_path, top_k=3, max_nodes=10).propose(state, 10)

    def expected(bias: bool):
        with torch.no_grad():
            feats = heads(state.hidden[0].cpu()).double()  # [D, H] (the heads built here live on the CPU)
            weight, hbias = head.weight.double().cpu(), head.bias.double().cpu()
            logits = feats @ weight[token_map].T + (hbias[token_map] if bias else 0)
        p, i = torch.softmax(logits, -1).topk(3, -1)
        return grow_tree([[token_map[r] for r in row] for row in i.tolist()], p.tolist(), 10)

    ids, parents = expected(bias=True)
    assert draft.token_ids[0].tolist() == ids and draft.parent[0].tolist() == parents
    assert expected(bias=False)[0] != ids  # (the bias matters for these heads)


# --- the conformance kit --------------------------------------------------------------------------------------------
# The kit supports hidden-state proposers: it fills DecodeState.hidden in the steps it simulates itself.


@pytest.fixture(scope="module")
def kit_heads(tmp_path_factory, specframe_tiny_target) -> Path:
    folder = tmp_path_factory.mktemp("kit-heads")
    hidden = int(specframe_tiny_target.model.get_output_embeddings().weight.shape[1])
    random_heads(3, 1, std=0.3, seed=2, hidden=hidden).save(folder, specframe_tiny_target.name)
    return folder


@pytest.fixture(scope="module")
def tree_kit(kit_heads, specframe_tiny_target) -> Kit:
    return Kit(MedusaProposer, {"heads": str(kit_heads), "top_k": 3, "max_nodes": 8}, samples=300,
               target=specframe_tiny_target)


def test_conformance_kit_on_trees(tree_kit):
    for check in ("check_contract", "check_greedy_lossless", "check_sampling_lossless",
                  "check_rollback_after_partial_acceptance", "check_determinism"):
        getattr(tree_kit, check)()  # raises ConformanceError on failure
    with pytest.raises(NotApplicable, match="deterministic"):
        tree_kit.check_draft_probs_match_samples()
    rec, results = tree_kit.greedy_battery
    assert any(not d.is_chain() for d in rec.drafts())  # the kit did see branching drafts
    assert sum(r.metrics.accepted_nodes for r in results) > 0  # and accepted draft nodes


def test_conformance_kit_feedback_check_on_trees(tree_kit):
    tree_kit.check_feedback()  # raises ConformanceError when on_verified disagrees with the accepted tree path
    rec, _ = tree_kit.greedy_battery
    assert any(not d.is_chain() for d in rec.drafts())  # the check walked real branching drafts


def test_conformance_kit_on_chains(kit_heads, specframe_tiny_target):
    kit = Kit(MedusaProposer, {"heads": str(kit_heads), "top_k": 1}, samples=200, target=specframe_tiny_target)
    kit.check_all()  # every check that applies, the feedback counts included
    rec, _ = kit.greedy_battery
    assert rec.drafts() and all(d.is_chain() for d in rec.drafts())
