"""The ``retrieval`` proposer (plugins/retrieval.py, REST): the trie and the draft tree it yields (topological
order, node budget, counts, shared prefixes once) against a brute-force reference, the most-frequent chain,
node confidence, exactness through the engine on tiny random targets (trees on llama/qwen2, chains on a
sliding-window qwen2), seeded sampling, datastore checks against the target, the default datastore, and the
conformance kit."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from specframe import DecodeState
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.config import load_config, resolve_plugins
from specframe.datastore import build_datastore
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.registry import build_registry
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.testing import Kit, NotApplicable
from specframe.testing.kit import PROMPTS as KIT_PROMPTS
from specframe.testing.tiny import reference_greedy
from specframe.token_tree import node_depths
from specframe_plugins.retrieval import (
    RetrievalConfig,
    RetrievalProposer,
    build_tree,
    most_frequent_chain,
)

from tests.fakes import ARCHS, PROMPT, PROMPT_2, VOCAB, build_model, build_tokenizer, check_metrics, hf_greedy

N_NEW = 40


# --- the tree --------------------------------------------------------------------------------------------------------


def test_docstring_examples():
    conts = [[5, 6, 7], [5, 6, 8], [5, 9], [4]]
    assert build_tree(conts, 4, 8) == ([5, 6, 4, 9], [-1, 0, -1, 0], [3, 2, 1, 1])
    assert most_frequent_chain([[5, 6, 7], [5, 6, 8], [5, 9]], 8) == ([5, 6, 7], [3, 2, 1])


def reference_tree(conts: list[list[int]], max_nodes: int, max_depth: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """Every distinct path (continuation prefix) with its count, the heaviest ``max_nodes`` first (ties: shallower,
    then first seen), as ``(paths, counts)``."""
    seen: dict[tuple[int, ...], int] = {}
    counts: Counter = Counter()
    for c in conts:
        for d in range(1, min(len(c), max_depth) + 1):
            path = tuple(c[:d])
            seen.setdefault(path, len(seen))
            counts[path] += 1
    order = sorted(seen, key=lambda p: (-counts[p], len(p), seen[p]))[:max_nodes]
    return order, [counts[p] for p in order]


def paths_of(tokens: list[int], parent: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i, tok in enumerate(tokens):
        assert -1 <= parent[i] < i  # topological: parents first
        out.append((out[parent[i]] if parent[i] >= 0 else ()) + (tok,))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_tree_equals_the_reference(seed):
    rng = random.Random(seed)
    for _ in range(100):
        conts = [[rng.randrange(4) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 12))]
        max_nodes, max_depth = rng.randint(1, 20), rng.randint(1, 6)
        tokens, parent, counts = build_tree(conts, max_nodes, max_depth)
        paths = paths_of(tokens, parent)
        assert len(set(paths)) == len(paths)  # shared prefixes once: no two siblings with the same token
        assert len(tokens) <= max_nodes and all(len(p) <= max_depth for p in paths)
        assert (paths, counts) == reference_tree(conts, max_nodes, max_depth)
        assert all(counts[i] <= counts[parent[i]] for i in range(len(tokens)) if parent[i] >= 0)


def test_chain_takes_the_most_frequent_child_each_step():
    conts = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 5], [1, 5, 6], [7]]
    assert most_frequent_chain(conts, 8) == ([1, 5, 6], [5, 3, 1])  # 5 (x3) beats 2 (x2) under 1
    assert most_frequent_chain(conts, 2) == ([1, 5], [5, 3])
    assert most_frequent_chain([[3, 4], [2, 9]], 8) == ([3, 4], [1, 1])  # ties: the first seen
    assert most_frequent_chain([], 8) == ([], [])


# --- the proposer on hand-made datastores -----------------------------------------------------------------------


class FakeTokenizer:
    """Enough of a tokenizer for the fingerprint check."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)


@pytest.fixture(scope="module")
def targets():
    return {arch: Target(build_model(arch), build_tokenizer(), name=f"tiny-{arch}") for arch in ARCHS}


def state(tokens: list[int]) -> DecodeState:
    return DecodeState(torch.tensor([tokens]), len(tokens), SamplingParams(), torch.Generator().manual_seed(0))


def test_propose_tree_budget_and_confidence(targets, tmp_path):
    ds = build_datastore([[1, 2, 5, 6, 7], [1, 2, 5, 6, 8], [1, 2, 5, 9], [9, 2, 4]], tmp_path / "ds",
                         vocab_size=VOCAB)
    prop = RetrievalProposer(RetrievalConfig(datastore=str(ds.path), min_suffix=1), targets["llama"].info)
    draft = prop.propose(state([30, 1, 2]), budget=16)
    assert draft.token_ids.tolist() == [[5, 6, 9, 7, 8]] and draft.parent.tolist() == [[-1, 0, 0, 1, 1]]
    assert draft.draft_probs is None  # deterministic: one-hot q
    assert prop.node_confidence() == [1.0, 2 / 3, 1 / 3, 1 / 3, 1 / 3]
    assert prop.last_retrieval.suffix_len == 2 and prop.last_retrieval.occurrences == 3
    draft = prop.propose(state([30, 1, 2]), budget=2)  # the budget caps nodes and depth
    assert draft.token_ids.tolist() == [[5, 6]] and len(prop.node_confidence()) == 2
    draft = prop.propose(state([30, 3, 2]), budget=16)  # only "2" matches: 4 continuations, one per document
    assert draft.token_ids.tolist() == [[5, 6, 4, 9, 7, 8]] and draft.parent.tolist() == [[-1, 0, -1, 0, 1, 1]]
    assert prop.node_confidence() == [3 / 4, 2 / 4, 1 / 4, 1 / 4, 1 / 4, 1 / 4]
    assert prop.propose(state([30, 31]), budget=16).num_nodes == 0 and prop.node_confidence() == []
    prop2 = RetrievalProposer(RetrievalConfig(datastore=str(ds.path), min_suffix=2), targets["llama"].info)
    assert prop2.propose(state([30, 3, 2]), budget=16).num_nodes == 0  # one-token suffixes not looked up


def test_chain_on_a_target_without_tree_support(targets, tmp_path):
    ds = build_datastore([[1, 2, 5, 6, 7], [1, 2, 5, 6, 8], [1, 2, 5, 9]], tmp_path / "ds", vocab_size=VOCAB)
    info = targets["qwen2-sliding"].info
    assert not info.supports_trees
    prop = RetrievalProposer(RetrievalConfig(datastore=str(ds.path), max_nodes=3), info)
    draft = prop.propose(state([1, 2]), budget=16)
    assert draft.is_chain() and draft.token_ids.tolist() == [[5, 6, 7]]  # max_nodes caps the chain too
    assert prop.node_confidence() == [1.0, 2 / 3, 1 / 3]


def test_config_validation():
    with pytest.raises(ValidationError, match=r"min_suffix \(5\) must be <= max_suffix \(3\)"):
        RetrievalConfig(min_suffix=5, max_suffix=3)
    with pytest.raises(ValidationError):
        RetrievalConfig(max_nodes=0)
    with pytest.raises(ValidationError):
        RetrievalConfig(datastor="x")  # extra="forbid"
    ((cls, cfg),) = resolve_plugins(load_config(None, proposers=[{"name": "retrieval", "max_depth": 4}]),
                                    build_registry()).proposers
    assert cls is RetrievalProposer and cfg == RetrievalConfig(max_depth=4)


def test_datastore_checks_against_the_target(targets, tmp_path):
    info = targets["llama"].info
    with pytest.raises(ConfigError, match="retrieval: datastore .*nope does not exist"):
        RetrievalProposer(RetrievalConfig(datastore=str(tmp_path / "nope")), info)
    wide = build_datastore([[1, 200]], tmp_path / "wide", vocab_size=256)
    with pytest.raises(ConfigError, match="token id 200, beyond the target's vocabulary \\(64\\)"):
        RetrievalProposer(RetrievalConfig(datastore=str(wide.path)), info)
    other = build_datastore([[1, 2]], tmp_path / "other", vocab_size=64, model="someone-else",
                            tokenizer={"class": "X", "fingerprint": "sha256:0000"})
    with pytest.raises(ConfigError, match="built with another tokenizer \\('someone-else'\\)"):
        RetrievalProposer(RetrievalConfig(datastore=str(other.path)), info)
    bare = Target(build_model("llama"), None, name="no-tokenizer").info
    RetrievalProposer(RetrievalConfig(datastore=str(other.path)), bare)  # nothing to compare: ids fit, accepted
    with pytest.raises(ConfigError, match="no `datastore` is set and the target has no tokenizer"):
        RetrievalProposer(RetrievalConfig(), bare)


def test_default_datastore_without_flags(targets, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path))
    prop = RetrievalProposer(RetrievalConfig(), targets["llama"].info)
    assert prop.datastore.path.parent == tmp_path / "datastores"
    assert prop.datastore.manifest["sources"][0]["preset"] == "pydoc"
    again = RetrievalProposer(RetrievalConfig(), targets["qwen2"].info)  # same tokenizer: the same entry
    assert again.datastore.path == prop.datastore.path
    assert len(list((tmp_path / "datastores").iterdir())) == 1


# --- exactness through the engine -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def references(targets):
    return {(arch, i): hf_greedy(t.model, p, N_NEW) for arch, t in targets.items()
            for i, p in enumerate((PROMPT, PROMPT_2))}


def corpus(rng: random.Random, prompts_and_refs: list[tuple[list[int], list[int]]], vocab: int) -> list[list[int]]:
    """Documents for none/some/all accepted: each prompt followed by its exact greedy continuation, by copies with
    every fifth token changed (one of them twice, so that it outweighs the exact one: the most frequent chain is
    then rejected at those tokens), and by random tokens; plus random documents."""
    docs = []
    for prompt, ref in prompts_and_refs:
        seq = list(prompt) + list(ref)
        docs.append(seq)
        for copies in (2, 1):
            changed = [t if i % 5 or i < len(prompt) else (t + 1 + rng.randrange(vocab - 1)) % vocab
                       for i, t in enumerate(seq)]
            docs += [changed] * copies
        for _ in range(3):
            docs.append(list(prompt) + [rng.randrange(vocab) for _ in range(20)])
    docs += [[rng.randrange(vocab) for _ in range(50)] for _ in range(20)]
    return docs


@pytest.fixture(scope="module")
def datastores(targets, references, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval-ds")
    out = {}
    for arch in ARCHS:
        docs = corpus(random.Random(0), [(PROMPT, references[(arch, 0)]), (PROMPT_2, references[(arch, 1)])], VOCAB)
        out[arch] = build_datastore(docs, root / arch, vocab_size=VOCAB).path
    return out


def spy_on(proposer: RetrievalProposer) -> list:
    drafts = []
    propose = proposer.propose

    def spy(st, budget):
        draft = propose(st, budget)
        drafts.append((draft, proposer.node_confidence()))
        return draft

    proposer.propose = spy
    return drafts


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt_index", [0, 1])
def test_greedy_output_equals_plain_greedy(targets, references, datastores, arch, prompt_index):
    target = targets[arch]
    prop = RetrievalProposer(RetrievalConfig(datastore=str(datastores[arch]), max_nodes=12), target.info)
    drafts = spy_on(prop)
    res = Engine(target, [prop], GreedyVerifier()).generate([PROMPT, PROMPT_2][prompt_index], max_new_tokens=N_NEW)
    assert res.token_ids == references[(arch, prompt_index)]
    check_metrics(res)
    assert res.metrics.accepted_nodes > 0 and res.metrics.accepted_nodes < res.metrics.drafted_nodes
    for draft, conf in drafts:
        assert len(conf) == draft.num_nodes  # confidence lines up with the nodes
        depth = node_depths(draft.parent[0].tolist())
        assert all(d <= 8 for d in depth)
    if arch == "qwen2-sliding":
        assert all(d.is_chain() for d, _ in drafts)  # the most frequent chain, never a tree
    else:
        assert any(not d.is_chain() for d, _ in drafts)


def test_sampling_is_seeded_and_reproducible(targets, datastores):
    target = targets["llama"]
    sampling = SamplingParams(temperature=0.8, top_p=0.95)

    def run(seed: int):
        prop = RetrievalProposer(RetrievalConfig(datastore=str(datastores["llama"])), target.info)
        return Engine(target, [prop], SpeculativeSamplingVerifier()).generate(
            PROMPT, max_new_tokens=N_NEW, sampling=sampling, seed=seed)

    a, b = run(3), run(3)
    assert a.token_ids == b.token_ids and a.metrics.accepted_nodes == b.metrics.accepted_nodes
    check_metrics(a)
    runs = [run(s).token_ids for s in (4, 5)]
    assert a.token_ids not in runs or runs[0] != runs[1]  # the seed matters


# --- the conformance kit ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kit_datastore(specframe_tiny_target, tmp_path_factory) -> Path:
    """The kit target's own greedy continuations of the kit prompts (exact, perturbed), and random text."""
    v = specframe_tiny_target.vocab_size
    refs = [(list(p), reference_greedy(specframe_tiny_target, list(p), 32)) for p in KIT_PROMPTS[:3]]
    docs = corpus(random.Random(1), refs, v)
    return build_datastore(docs, tmp_path_factory.mktemp("kit-ds") / "ds", vocab_size=v).path


def test_conformance_kit(kit_datastore, specframe_tiny_target):
    kit = Kit(RetrievalProposer, {"datastore": str(kit_datastore), "max_nodes": 8}, samples=300,
              target=specframe_tiny_target)
    for check in ("check_contract", "check_greedy_lossless", "check_sampling_lossless",
                  "check_rollback_after_partial_acceptance", "check_determinism", "check_feedback"):
        getattr(kit, check)()  # raises ConformanceError on failure
    with pytest.raises(NotApplicable, match="deterministic"):
        kit.check_draft_probs_match_samples()
    rec, results = kit.greedy_battery
    assert any(not d.is_chain() for d in rec.drafts())  # the kit saw branching drafts
    assert sum(r.metrics.accepted_nodes for r in results) > 0  # and accepted nodes


def test_registered_under_its_name():
    assert build_registry().proposer("retrieval") is RetrievalProposer
