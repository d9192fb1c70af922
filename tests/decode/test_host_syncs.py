"""The host-sync counter (specframe.testing.host_syncs): concrete counts for tiny snippets, both h2d rules, nesting,
per-step averages; and the syncs the issue-69 changes took out (EAGLE tree levels, the grammar mask's copy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specframe.testing.host_syncs import HostSyncs, count_host_syncs, per_step


def test_reads_count_once_each():
    t = torch.tensor([3])
    with count_host_syncs() as s:
        int(t)
    assert s.by_kind == {"int": 1} and s.total == 1
    with count_host_syncs() as s:
        t.tolist()  # (torch reads each element inside tolist: not counted again)
    assert s.by_kind == {"tolist": 1}
    with count_host_syncs() as s:
        for _ in range(3):
            t.item()
    assert s.by_kind == {"item": 3} and s.total == 3


@pytest.mark.parametrize("snippet, kind", [
    (lambda t, m: float(t), "float"),
    (lambda t, m: bool(t), "bool"),
    (lambda t, m: 1 if t else 0, "bool"),
    (lambda t, m: [0, 1, 2, 3, 4][t], "index"),
    (lambda t, m: t.cpu(), "cpu"),
    (lambda t, m: t.numpy(), "numpy"),
    (lambda t, m: np.asarray(t), "numpy"),
    (lambda t, m: t.nonzero(), "nonzero"),
    (lambda t, m: t[m], "nonzero"),
    (lambda t, m: torch.equal(t, t), "compare"),
    (lambda t, m: f"{t}", "format"),
])
def test_each_kind(snippet, kind):
    t, m = torch.tensor([3]), torch.tensor([True])
    with count_host_syncs() as s:
        snippet(t, m)
    assert s.by_kind == {kind: 1}


def test_device_side_work_is_not_counted():
    t = torch.arange(6.0)
    with count_host_syncs(cpu_only=True) as s:
        u = (t * 2).softmax(-1).topk(2).indices
        torch.zeros(3, device="cpu")
        torch.full((2,), 1.0, device="cpu")
        torch.arange(3, device="cpu")
        t.to(torch.float64)  # a dtype only
        t[u]  # integer indexing: no sync
        t.shape[0]
    assert s.total == 0, s.by_kind


def test_h2d_cpu_only_rule_counts_calls_that_name_a_device():
    t = torch.ones(2)
    with count_host_syncs(cpu_only=True) as s:
        t.to("cpu")
        t.to(device=torch.device("cpu"))
        t.to("cpu", torch.float64)
        torch.tensor([1, 2], device="cpu")
        torch.as_tensor([1, 2], device="cpu")
        t.new_tensor([1], device="cpu")
        torch.tensor([1, 2])  # no device named
        t.to(torch.ones(1))  # another tensor's device: not named
        torch.empty(2).copy_(t)
    assert s.by_kind == {"h2d": 6}


def test_h2d_device_rule_counts_only_real_copies():
    t = torch.ones(2)
    with count_host_syncs(cpu_only=False) as s:  # every tensor here is on the host: nothing crosses
        t.to("cpu")
        torch.tensor([1, 2], device="cpu")
        t.new_tensor([1])
        torch.empty(2).copy_(t)
    assert s.total == 0


def test_contexts_nest_and_per_step():
    t = torch.tensor([1.0])
    with count_host_syncs() as outer:
        t.item()
        with count_host_syncs() as inner:
            t.tolist()
            int(t)
    assert inner.by_kind == {"tolist": 1, "int": 1}
    assert outer.by_kind == {"item": 1, "tolist": 1, "int": 1} and outer.total == 3
    assert per_step(outer, 2) == {"int": 0.5, "item": 0.5, "tolist": 0.5, "total": 1.5}
    assert per_step({"item": 4}, 4) == {"item": 1.0, "total": 1.0}
    with pytest.raises(ValueError):
        per_step(HostSyncs(), 0)


def test_sites_name_the_caller():
    t = torch.tensor([1])
    with count_host_syncs(sites=True) as s:
        t.item()
    ((kind, site),) = s.sites
    assert kind == "item" and site.startswith(__file__)


def test_other_threads_are_not_counted():
    import threading

    t = torch.tensor([1])
    with count_host_syncs() as s:
        th = threading.Thread(target=lambda: t.item())
        th.start()
        th.join()
    assert s.total == 0


# --- the reductions of issue 69 -----------------------------------------------------------------------------------


def test_eagle_tree_reads_the_host_once_per_level(tmp_path):
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine
    from specframe.target.hf import Target
    from specframe_plugins.eagle import EagleConfig, EagleProposer

    from tests.fakes import NAME, PROMPT, build_model, build_tokenizer, random_drafter

    t = Target(build_model("llama", num_hidden_layers=4), build_tokenizer(), name=NAME)
    random_drafter(t.model, layers=(1, 2, 4)).save(tmp_path)
    p = EagleProposer(EagleConfig(weights=str(tmp_path), top_k=3, max_nodes=64, depth=4), t.info)
    levels = []
    level = p._level

    def spy(*args):
        levels.append(1)
        return level(*args)

    p._level = spy
    req = Engine(t, [p], GreedyVerifier()).request(PROMPT, max_new_tokens=8)
    with torch.inference_mode():
        req.start()
        state = req.state
        p._catch_up(state)  # the drafter's cache over the prompt, outside the count
        with count_host_syncs(cpu_only=True) as s:
            draft = p._tree(int(state.tokens.shape[1]), 4, 3, 64, prune=False)
    req.close()
    assert draft.num_nodes > 3 and len(levels) == 3
    # per level: one read of the children (scores and token ids together) and one copy (tokens, positions, mask);
    # plus the root's one read
    assert s.by_kind == {"tolist": 1 + len(levels), "h2d": len(levels)}, s.by_kind


def test_grammar_mask_copies_the_packed_bitmask_once():
    from specframe.contracts import DraftTree
    from specframe.contracts.constraint import ConstraintSpec
    from specframe.grammar.llguidance_engine import LLGuidanceEngine

    from tests.fakes import BPE_EOS, build_bpe_tokenizer

    tok = build_bpe_tokenizer()
    c = LLGuidanceEngine(tok, len(tok), {BPE_EOS}).compile(ConstraintSpec(regex="[a-z]{2,6}-[0-9]{1,4}"))
    ids = tok.encode("abc")
    draft = DraftTree.from_lists(ids, list(range(-1, len(ids) - 1)))
    logits = torch.zeros((1, len(ids) + 1, len(tok)))
    with count_host_syncs(cpu_only=True) as s:
        out = c.mask(draft, logits)
    # the draft read once (tokens, parents) and the bitmask copied once; nothing read back from the mask
    assert s.by_kind == {"tolist": 2, "h2d": 1}, s.by_kind
    assert torch.isinf(out[0, 0]).any() and torch.isfinite(out[0, 0]).any()


def _reference_tree_mask(parent: list[int], past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The mask as it was built before issue 69: the whole [N + 1, past + N + 1] on the host, row by row."""
    n = len(parent)
    allowed = torch.zeros((n + 1, past_len + n + 1), dtype=torch.bool)
    allowed[:, : past_len + 1] = True
    for i, p in enumerate(parent):
        if p >= 0:
            allowed[i + 1, past_len + 1 :] = allowed[p + 1, past_len + 1 :]
        allowed[i + 1, past_len + 1 + i] = True
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tree_attention_mask_values_unchanged_and_one_small_copy(dtype):
    import random

    from specframe.token_tree import tree_attention_mask

    rng = random.Random(0)
    for _ in range(100):
        n, past = rng.randint(0, 16), rng.randint(0, 24)
        parent = [rng.randint(-1, i - 1) for i in range(n)]
        with count_host_syncs(cpu_only=True) as s:
            got = tree_attention_mask(parent, past, dtype, "cpu")
        want = _reference_tree_mask(parent, past, dtype)
        assert got.dtype == want.dtype and torch.equal(got, want), (parent, past)
        assert s.by_kind == {"h2d": 1}  # the [N + 1, N + 1] block only
