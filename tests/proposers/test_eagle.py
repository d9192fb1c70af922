"""The ``eagle`` proposer (plugins/eagle.py), its drafter (specframe.learned.eagle_drafter) and its recipe
(specframe.training.eagle), on tiny random targets: greedy exactness on several architectures alone and with
ngram, the engine's features (right layers, every committed position, along the accepted path), training-time
test = what drafting computes, the sampling distribution of the drafts (conformance kit), the dynamic tree, the
chain fallbacks (sliding-window target, top_k 1, near the context limit), learning, resume and errors."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from specframe import DecodeState
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.errors import ConfigError
from specframe.learned.eagle_drafter import EagleDrafter, EagleSpec, init_from_target, new_drafter
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe.testing import Kit
from specframe.training.eagle import EagleSettings, finish_eagle, train_eagle
from specframe_plugins.eagle import EagleConfig, EagleProposer
from specframe_plugins.merge_policies import PriorityConfig, PriorityPolicy
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import (
    ARCHS,
    NAME,
    PROMPT,
    PROMPT_2,
    VOCAB,
    build_model,
    build_tokenizer,
    check_metrics,
    hf_greedy,
    random_drafter,
    test_device,
)

pytestmark = pytest.mark.device_subset

DEV = test_device()  # the targets (build_model) live here; tensors that meet them are put here too
N_NEW = 32


@pytest.fixture(scope="module")
def targets() -> dict[str, Target]:
    return {a: Target(build_model(a, num_hidden_layers=4), build_tokenizer(), name=NAME) for a in ARCHS}


@pytest.fixture(scope="module")
def drafters(targets, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for arch, t in targets.items():
        folder = tmp_path_factory.mktemp(f"eagle-{arch}")
        random_drafter(t.model, layers=(1, 2, 4)).save(folder)  # 4 = after the final norm
        out[arch] = folder
    return out


def eagle(target: Target, folder: Path, **kw) -> EagleProposer:
    return EagleProposer(EagleConfig(weights=str(folder), **kw), target.info)


def run(target: Target, proposers, sampling=SamplingParams(), prompt=PROMPT, n=N_NEW, seed=0, merge=None):
    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    return Engine(target, proposers, verifier, merge=merge).generate(prompt, max_new_tokens=n, sampling=sampling,
                                                                    seed=seed)


# --- exactness -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("opts", [{}, {"top_k": 1}, {"max_nodes": 3, "depth": 2}, {"top_k": 6, "max_nodes": 40}])
def test_greedy_output_equals_transformers(targets, drafters, arch, opts):
    t = targets[arch]
    for prompt in (PROMPT, PROMPT_2, [7]):
        r = run(t, [eagle(t, drafters[arch], **opts)], prompt=prompt)
        assert r.token_ids == hf_greedy(t.model, prompt, N_NEW)
        check_metrics(r)
        assert r.metrics.drafted_nodes > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_with_ngram_greedy_output_equals_transformers(targets, drafters, arch):
    t = targets[arch]
    props = [NgramProposer(NgramConfig(), t.info), eagle(t, drafters[arch])]
    r = run(t, props, merge=PriorityPolicy(PriorityConfig(max_nodes=16)))
    assert r.token_ids == hf_greedy(t.model, PROMPT, N_NEW)
    check_metrics(r)
    assert r.metrics.proposers["eagle"].drafted_nodes > 0


def test_trained_drafter_on_its_target_is_accepted_and_exact(learned):
    t, folder, _ = learned
    for prompt in HELD_OUT:
        r = run(t, [eagle(t, folder)], prompt=prompt, n=24)
        assert r.token_ids == hf_greedy(t.model, prompt, 24)
        check_metrics(r)


# --- the engine's features ---------------------------------------------------------------------------------------


class Spy(EagleProposer):
    """Records a copy of the features and tokens it is shown at each propose."""

    def start(self, state):
        super().start(state)
        self.seen = []

    def propose(self, state, budget):
        self.seen.append((state.tokens.clone(), None if state.features is None else state.features.clone(),
                          state.feature_layers))
        return super().propose(state, budget)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_features_are_the_targets_hidden_states_at_every_committed_position(targets, drafters, arch):
    t = targets[arch]
    spy = Spy(EagleConfig(weights=str(drafters[arch])), t.info)
    assert spy.feature_layers == (1, 2, 4)
    r = run(t, [spy])
    assert r.metrics.accepted_nodes > 0  # some steps committed several tokens (features along accepted paths)
    for tokens, feats, layers in spy.seen:
        assert layers == (1, 2, 4)
        ids = tokens[0].tolist()
        assert feats.shape == (1, len(ids) - 1, 3, 32)  # every position but the newest
        with torch.no_grad():
            hs = t.model(input_ids=torch.tensor([ids[:-1]], device=t.device), output_hidden_states=True).hidden_states
        want = torch.stack([hs[i] for i in layers], 2)
        torch.testing.assert_close(feats, want, rtol=1e-4, atol=1e-4)


def test_default_feature_layers_low_middle_high():
    cfg = build_model("llama", num_hidden_layers=30).config
    assert EagleSpec.for_target(cfg).feature_layers == (2, 15, 28)
    assert EagleSpec.for_target(build_model("llama").config).feature_layers == (1, 2)
    with pytest.raises(ConfigError, match="feature layers"):
        EagleSpec.for_target(cfg, feature_layers=(31,))


def test_engine_without_feature_support_drafts_nothing(targets, drafters, caplog):
    t = targets["llama"]

    class Plain:  # a target adapter without forward_features
        def __getattr__(self, name):
            if name == "forward_features":
                raise AttributeError(name)
            return getattr(t, name)

    r = Engine(Plain(), [eagle(t, drafters["llama"])], GreedyVerifier()).generate(PROMPT, max_new_tokens=8)
    assert r.token_ids == hf_greedy(t.model, PROMPT, 8)
    assert r.metrics.drafted_nodes == 0
    assert "cannot return hidden-state features" in caplog.text


# --- training-time test = drafting ----------------------------------------------------------------------------------


def test_unrolled_passes_equal_step_by_step_drafting(targets):
    """Pass j at index t of the training-time test is the drafter's j-th step when the real features end at
    t - j + 1: computed here step by step with the KV cache, the way the proposer drafts."""
    t = targets["llama"]
    d = random_drafter(t.model).to(DEV).eval()
    torch.manual_seed(0)
    n, h = 12, 32
    g = torch.randn(1, n, h).to(DEV)
    emb = torch.randn(1, n, h).to(DEV)
    with torch.no_grad():
        outs = d.unrolled(g, emb, 3)
        for c in (0, 4, 8):  # real features end at position c
            pos = torch.arange(c + 1, device=DEV)[None]
            a1, past = d.step(g[:, : c + 1], emb[:, : c + 1], pos, None, None)
            torch.testing.assert_close(a1[:, c], outs[0][:, c], rtol=1e-5, atol=1e-5)
            prev = a1[:, c : c + 1]
            for j in (2, 3):
                p = c + j - 1
                a, kv = d.step(prev, emb[:, p : p + 1], torch.tensor([[p]], device=DEV), past, None)
                torch.testing.assert_close(a[:, 0], outs[j - 1][:, p], rtol=1e-5, atol=1e-5)
                past = (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
                prev = a


def test_unrolled_ignores_padding():
    d = random_drafter(build_model("llama")).to(DEV).eval()
    g, emb = torch.randn(2, 9, 32).to(DEV), torch.randn(2, 9, 32).to(DEV)
    valid = torch.ones(2, 9, dtype=torch.bool, device=DEV)
    valid[1, 6:] = False
    g2, emb2 = g.clone(), emb.clone()
    g2[1, 6:], emb2[1, 6:] = 100.0, -100.0  # garbage in the padding
    with torch.no_grad():
        a = d.unrolled(g, emb, 3, valid)
        b = d.unrolled(g2, emb2, 3, valid)
    for x, y in zip(a, b):
        torch.testing.assert_close(x[1, :6], y[1, :6])
        assert torch.isfinite(x).all()


# --- drafts ----------------------------------------------------------------------------------------------------


def test_tree_is_the_most_likely_nodes_in_topological_order(targets, drafters):
    t = targets["llama"]
    p = eagle(t, drafters["llama"], top_k=3, max_nodes=10, depth=4)
    spy_state = _state_after_prefill(t, p, PROMPT)
    draft = p.propose(spy_state, 64)
    parent = draft.parent[0].tolist()
    assert draft.num_nodes == 10 and not draft.is_chain()
    assert all(pp < i for i, pp in enumerate(parent))  # parents first
    depth = []
    for pp in parent:
        depth.append(1 if pp < 0 else depth[pp] + 1)
    assert depth == sorted(depth) and max(depth) <= 4
    assert sum(1 for pp in parent if pp < 0) <= 3  # top_k children of the root at most
    assert draft.draft_probs is None  # greedy: deterministic
    assert p.propose(_state_after_prefill(t, p, PROMPT), 4).num_nodes == 4  # the step's budget caps the tree


@pytest.mark.parametrize("top_k", [1, 3])
def test_tree_entries_equal_their_path_computed_independently(targets, top_k):
    """Every drafter entry of the dynamic tree (one per expanded node) equals the drafter run with plain
    sequential steps along that node's own path (the committed context, then the path's entries only): the tree
    mask lets an entry see its ancestors and nothing else."""
    t = targets["llama"]
    prompt = PROMPT[:3]  # a short context: each tree entry weighs much in its descendants' attention
    d = random_drafter(t.model, layers=(1, 2, 4))
    with torch.no_grad():  # attention dominates the residual stream, so a wrong mask shows
        d.layer.v_proj.weight.mul_(40.0)
    folder = Path(__import__("tempfile").mkdtemp())
    d.save(folder)
    p = eagle(t, folder, top_k=top_k, max_nodes=12, depth=5)
    entries = []  # (token, position, ancestor entries nearest first, output)
    level = p._level

    def spy(parents_a, tokens, positions, ancestors, n_tree):
        a = level(parents_a, tokens, positions, ancestors, n_tree)
        entries.extend(zip(tokens, positions, ancestors, a.clone()))
        return a

    p._level = spy
    full = p._tree
    p._tree = lambda *a: full(*a, prune=False)  # every level (this drafter's flat distributions would be pruned)
    state = _state_after_prefill(t, p, prompt)
    assert p.propose(state, 64).num_nodes >= 5
    assert sum(1 for e in entries if len(e[2]) >= 2) >= 2  # entries two levels deep or more were checked
    emb = t.model.get_input_embeddings()
    with torch.no_grad():
        n = len(prompt) - 1
        cols = [state.feature_layers.index(i) for i in p.feature_layers]
        a, past = p.drafter.drafter.step(p.drafter.drafter.fuse_features(state.features[:, :, cols]), emb(torch.tensor([prompt[1:]], device=DEV)),
                                 torch.arange(n, device=DEV)[None], None, None)
        for token, pos, anc, out in entries:
            prev, kv = a[:, -1:], past
            for e in [*reversed(anc), None]:
                tok, ps = (entries[e][0], entries[e][1]) if e is not None else (token, pos)
                prev, new = p.drafter.drafter.step(prev, emb(torch.tensor([[tok]], device=DEV)),
                                                   torch.tensor([[ps]], device=DEV), kv, None)
                kv = (torch.cat([kv[0], new[0]], 2), torch.cat([kv[1], new[1]], 2))
            torch.testing.assert_close(prev[0, 0], out, rtol=1e-4, atol=1e-4)


def _state_after_prefill(t: Target, p: EagleProposer, prompt: list[int], sampling=SamplingParams(), seed=0):
    layers = tuple(sorted(p.feature_layers))
    with torch.no_grad():
        hs = t.model(input_ids=torch.tensor([prompt[:-1]], device=t.device), output_hidden_states=True).hidden_states
    gen = torch.Generator(device=t.device).manual_seed(seed)  # as the engine's: on the target's device
    state = DecodeState(torch.tensor([prompt]), len(prompt), sampling, gen, None,
                        torch.stack([hs[i] for i in layers], 2), layers)
    p.start(state)
    return state


def test_sliding_window_target_gets_chains(targets, drafters):
    t = targets["qwen2-sliding"]
    assert not t.info.supports_trees
    p = eagle(t, drafters["qwen2-sliding"], top_k=4, depth=5)
    draft = p.propose(_state_after_prefill(t, p, PROMPT), 64)
    assert draft.is_chain() and draft.num_nodes == 5


def test_near_the_context_limit_drafts_get_shorter(drafters):
    model = build_model("llama", num_hidden_layers=4, max_position_embeddings=40)
    t = Target(model, build_tokenizer(), name=NAME)
    p = eagle(t, drafters["llama"], top_k=1, depth=6)
    prompt = (PROMPT * 4)[:36]
    draft = p.propose(_state_after_prefill(t, p, prompt), 64)
    assert draft.num_nodes == 40 - 36  # the target holds 40 positions
    r = run(t, [eagle(t, drafters["llama"])], prompt=prompt, n=3)
    assert r.token_ids == hf_greedy(model, prompt, 3)


def test_one_token_prompt_has_no_draft_until_a_position_is_processed(targets, drafters):
    t = targets["llama"]
    p = eagle(t, drafters["llama"])
    state = DecodeState(torch.tensor([[5]]), 1, SamplingParams(), torch.Generator(device=t.device), None, None,
                        p.feature_layers)
    p.start(state)
    assert p.propose(state, 8).num_nodes == 0


def test_sampled_chain_is_seeded_and_carries_q(targets, drafters):
    t = targets["llama"]
    p = eagle(t, drafters["llama"], depth=4)
    sp = SamplingParams(temperature=0.9, top_p=0.95)
    a = p.propose(_state_after_prefill(t, p, PROMPT, sp, seed=3), 64)
    b = p.propose(_state_after_prefill(t, p, PROMPT, sp, seed=3), 64)
    assert a.is_chain() and a.num_nodes == 4
    assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.draft_probs, b.draft_probs)
    q = a.draft_probs[0]
    assert q.shape == (4, VOCAB)
    torch.testing.assert_close(q.sum(-1), torch.ones(4, device=q.device))
    assert all(q[i, a.token_ids[0, i]] > 0 for i in range(4))


def test_subset_head_drafts_only_subset_tokens(targets, tmp_path):
    t = targets["llama"]
    subset = torch.arange(10, 30)
    random_drafter(t.model, subset=subset).save(tmp_path)
    p = eagle(t, tmp_path, top_k=4, max_nodes=20)
    draft = p.propose(_state_after_prefill(t, p, PROMPT), 64)
    assert set(draft.token_ids[0].tolist()) <= set(subset.tolist())
    r = run(t, [eagle(t, tmp_path)])
    assert r.token_ids == hf_greedy(t.model, PROMPT, N_NEW)
    q = eagle(t, tmp_path).propose(_state_after_prefill(t, p, PROMPT, SamplingParams(temperature=1.0)), 8).draft_probs
    assert float(q[0, :, :10].sum()) == 0.0 and float(q[0, :, 30:].sum()) == 0.0


def test_sampling_is_fault_free_and_seeded(targets, drafters):
    t = targets["qwen2"]
    sp = SamplingParams(temperature=0.8)
    a = run(t, [eagle(t, drafters["qwen2"])], sampling=sp, seed=11)
    b = run(t, [eagle(t, drafters["qwen2"])], sampling=sp, seed=11)
    assert a.token_ids == b.token_ids and len(a.token_ids) == N_NEW
    check_metrics(a)


# --- conformance kit: greedy and sampling exactness, draft probabilities (total variation), rollback ---------------


@pytest.fixture(scope="module")
def kit_drafter(tmp_path_factory, specframe_tiny_target) -> Path:
    folder = tmp_path_factory.mktemp("kit-eagle")
    m = specframe_tiny_target.model
    spec = EagleSpec.for_target(m.config, specframe_tiny_target.name)
    d = new_drafter(spec, torch.arange(m.config.vocab_size), seed=4)
    init_from_target(d, m)
    d.save(folder)
    return folder


def test_conformance_kit(kit_drafter, specframe_tiny_target):
    kit = Kit(EagleProposer, {"weights": str(kit_drafter), "top_k": 3, "max_nodes": 8}, samples=300,
              target=specframe_tiny_target)
    for check in ("check_contract", "check_greedy_lossless", "check_sampling_lossless",
                  "check_draft_probs_match_samples", "check_rollback_after_partial_acceptance", "check_determinism",
                  "check_feedback"):
        getattr(kit, check)()  # raises ConformanceError on failure
    rec, results = kit.greedy_battery
    assert any(not d.is_chain() for d in rec.drafts())
    assert sum(r.metrics.drafted_nodes for r in results) > 0


# --- training ---------------------------------------------------------------------------------------------------

HELD_OUT = [[random.Random(1000 + i).randrange(1, VOCAB) for _ in range(6)] for i in range(5)]


def _records(model, n: int) -> list[dict]:
    out = []
    for i in range(n):
        r = random.Random(i)
        prompt = [r.randrange(1, VOCAB) for _ in range(6)]
        out.append({"kind": "x", "prompt_ids": prompt, "response_ids": hf_greedy(model, prompt, 20)})
    return out


SETTINGS = EagleSettings(vocab_subset=VOCAB, epochs=12, batch_size=8, lr=3e-3, warmup=5, autocast=False)


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    model = build_model("llama", num_hidden_layers=4, seed=3)
    t = Target(model, build_tokenizer(), name=NAME)
    out = tmp_path_factory.mktemp("eagle-trained")
    records = _records(model, 48)
    summary = train_eagle(t, records, out, SETTINGS)
    finish_eagle(summary["drafter"], out)
    return t, out, summary


def _tau(t: Target, folder: Path) -> float:
    toks = fwd = 0
    for prompt in HELD_OUT:
        r = run(t, [eagle(t, folder, max_nodes=8)], prompt=prompt, n=20)
        toks, fwd = toks + len(r.token_ids), fwd + r.metrics.target_forwards
    return toks / fwd


def test_training_learns_the_targets_continuations(learned, tmp_path):
    t, folder, summary = learned
    assert summary["steps"] == 12 * 6
    assert summary["init_from_target_layer"] is True
    assert summary["final_acc"] > 0.5
    assert len(summary["final_acc_by_pass"]) == SETTINGS.ttt_steps
    assert (folder / "loss.png").is_file() and (folder / "train-log.jsonl").is_file()
    random_drafter(t.model, seed=9).save(tmp_path)
    trained, untrained = _tau(t, folder), _tau(t, tmp_path)
    assert trained > 1.5 and trained > untrained + 0.3


def test_training_resumes_exactly(tmp_path):
    model = build_model("llama", num_hidden_layers=4, seed=3)
    t = Target(model, build_tokenizer(), name=NAME)
    records = _records(model, 16)
    s = EagleSettings(vocab_subset=VOCAB, epochs=30, batch_size=8, lr=3e-3, warmup=5, autocast=False)
    full = train_eagle(t, records, tmp_path / "full", s)["drafter"]
    part = tmp_path / "part"
    steps = []
    with pytest.raises(KeyboardInterrupt):
        train_eagle(t, records, part, s, progress=lambda st, n, loss: steps.append(st) or (
            (_ for _ in ()).throw(KeyboardInterrupt) if st == 53 else None))
    resumed = train_eagle(t, records, part, s)["drafter"]
    for (k, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    with pytest.raises(ConfigError, match="other settings"):
        train_eagle(t, records, part, EagleSettings(vocab_subset=VOCAB, epochs=31, autocast=False))


def test_training_in_pieces_equals_one_run(tmp_path, monkeypatch):
    """A deadline stops training right after the step that passes it, with a checkpoint (PieceDone); calling again
    resumes: three pieces give the same weights as one run, and the summary counts the pieces and their time."""
    from specframe.training import common
    from specframe.training.common import PieceDone

    model = build_model("llama", num_hidden_layers=4, seed=3)
    t = Target(model, build_tokenizer(), name=NAME)
    records = _records(model, 16)
    s = EagleSettings(vocab_subset=VOCAB, epochs=6, batch_size=8, lr=3e-3, warmup=5, autocast=False)
    full = train_eagle(t, records, tmp_path / "full", s)
    clock = {"now": 0.0}
    monkeypatch.setattr(common.time, "monotonic", lambda: clock["now"])

    def tick(step, total, loss):
        clock["now"] += 1.0  # one "second" per step

    part = tmp_path / "part"
    stops = []
    for _ in range(2):
        with pytest.raises(PieceDone) as piece:
            train_eagle(t, records, part, s, progress=tick, deadline=clock["now"] + 3.5)
        stops.append(piece.value.step)
        assert torch.load(part / "ckpt.pt", weights_only=False)["step"] == piece.value.step
    assert stops == [4, 8] and piece.value.total == full["steps"]
    last = train_eagle(t, records, part, s, progress=tick)
    assert last["pieces"] == 3 and last["train_s"] == pytest.approx(full["steps"], abs=0.5)
    for (k, a), (_, b) in zip(full["drafter"].state_dict().items(), last["drafter"].state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_training_refuses_a_corpus_without_responses(targets, tmp_path):
    with pytest.raises(ConfigError, match="no usable responses"):
        train_eagle(targets["llama"], [{"kind": "x", "prompt_ids": [1, 2], "response_ids": [3]}], tmp_path,
                    SETTINGS)


# --- format and errors ------------------------------------------------------------------------------------------


def test_save_load_round_trip(targets, tmp_path):
    d = random_drafter(targets["llama"].model, subset=torch.tensor([3, 5, 8]))
    d.save(tmp_path)
    e = EagleDrafter.load(tmp_path, 32, VOCAB)
    assert e.spec.feature_layers == d.spec.feature_layers and torch.equal(e.token_map, d.token_map)
    for (k, a), (_, b) in zip(d.state_dict().items(), e.state_dict().items()):
        assert torch.equal(a, b), k


def test_load_errors(targets, tmp_path):
    with pytest.raises(ConfigError, match="holds no EAGLE drafter"):
        EagleDrafter.load(tmp_path)
    random_drafter(targets["llama"].model).save(tmp_path)
    with pytest.raises(ConfigError, match="hidden 32.*this target has hidden 64"):
        EagleDrafter.load(tmp_path, 64, VOCAB)
    with pytest.raises(ConfigError, match="vocabulary"):
        EagleDrafter.load(tmp_path, 32, 100)
    meta = tmp_path / "eagle.json"
    meta.write_text(meta.read_text().replace('"format": 1', '"format": 9'))
    with pytest.raises(ConfigError, match="format 9"):
        EagleDrafter.load(tmp_path)


def test_no_shipped_weights_for_an_unknown_target(targets):
    with pytest.raises(ConfigError, match="no EAGLE drafter is shipped for target"):
        EagleProposer(EagleConfig(), targets["llama"].info)


@pytest.mark.parametrize("bad", [{"depth": 0}, {"top_k": 0}, {"max_nodes": 0}, {"unknown": 1}])
def test_config_validation(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        EagleConfig(**bad)


def test_warm_start_goes_on_from_the_given_drafter(learned, tmp_path):
    """--init: training starts from the given drafter (its weights, head rows, feature layers), not from a new
    one: with learning rate 0 the result is that drafter, bit for bit; other feature layers are refused."""
    t, folder, _ = learned
    records = _records(t.model, 8)
    start = EagleDrafter.load(folder)
    s = EagleSettings(vocab_subset=16, epochs=1, batch_size=8, lr=1e-12, warmup=0, autocast=False, init=str(folder))
    out = train_eagle(t, records, tmp_path / "warm", s)
    assert out["init_from_target_layer"] is False and out["steps"] == 1
    assert torch.equal(out["drafter"].token_map, start.token_map)  # the head keeps its rows (not a 16-token subset)
    for (k, a), (_, b) in zip(start.state_dict().items(), out["drafter"].state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9, msg=k)
    with pytest.raises(ConfigError, match="feature layers"):
        train_eagle(t, records, tmp_path / "other", EagleSettings(init=str(folder), feature_layers=(1, 2),
                                                                  autocast=False))


@pytest.mark.parametrize("max_nodes,top_k", [(2, 2), (4, 4), (6, 3), (16, 4)])
def test_pruned_levels_leave_the_tree_unchanged(targets, drafters, max_nodes, top_k):
    """The tree stops growing once no deeper node can be among the max_nodes kept: the same tree as expanding
    every level, with fewer drafter passes where the kept nodes are all shallow."""
    t = targets["llama"]
    p = eagle(t, drafters["llama"], top_k=top_k, max_nodes=max_nodes, depth=8)
    passes = {True: 0, False: 0}
    level = p._level

    for prompt in (PROMPT, PROMPT_2):
        state = _state_after_prefill(t, p, prompt)
        assert p._catch_up(state)
        length = int(state.tokens.shape[1])
        trees = {}
        for prune in (False, True):
            def counted(*a, _prune=prune, **kw):
                passes[_prune] += 1
                return level(*a, **kw)
            p._level = counted
            trees[prune] = p._tree(length, 8, top_k, max_nodes, prune=prune)
        p._level = level
        assert trees[True].token_ids.tolist() == trees[False].token_ids.tolist()
        assert trees[True].parent.tolist() == trees[False].parent.tolist()
    assert passes[False] == 2 * 7  # every level below the first, twice
    # an untrained drafter's flat distributions make deep paths unlikely: its deep levels are skipped
    assert passes[True] < passes[False]
