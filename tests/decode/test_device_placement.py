"""Drafts made on another device than the scorer's are verified, not refused (issue 69).

No accelerator here, so another device is simulated: :class:`OnOtherDevice` keeps CPU storage but reports
``cuda:0`` and raises torch's own same-device error whenever it meets a plain (CPU) tensor, as a CUDA tensor does;
``.cpu()`` brings it back. Before the engine placed drafts, such a draft met the newest token (CPU) in the scorer's
``torch.cat`` and the engine took the error for a refused draft: target-only for the rest of the request.
The scorer's own placement is checked on ``meta``: whatever it is handed, the forward gets tensors on its device.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten

from specframe import DraftTree
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.engine import Engine
from specframe.decode.target_scorer import TargetScorer
from specframe.errors import DeviceError
from specframe.sampling import SamplingParams

from tests.fakes import PROMPT, VOCAB, ScriptedChain, ScriptedTree, check_metrics, hf_greedy

_SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"


class OnOtherDevice(torch.Tensor):
    """CPU storage that behaves as if it lived on ``cuda:0`` (see the module docstring)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cpu:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        leaves, _ = tree_flatten((args, kwargs))
        plain = [t for t in leaves if isinstance(t, torch.Tensor) and not isinstance(t, OnOtherDevice)]
        if plain and any(t.dim() > 0 for t in plain):
            raise RuntimeError(_SAME_DEVICE)
        if func is torch.Tensor.to and _device_named(leaves) == "cpu":
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        return super().__torch_function__(func, types, args, kwargs)


def _device_named(leaves) -> str | None:
    named = [torch.device(a).type for a in leaves if isinstance(a, (str, torch.device))]
    return named[0] if named else None


class SimulatedCuda(torch.overrides.TorchFunctionMode):
    """While active, ``plain.to("cuda:0")`` (or any device named cuda) gives an :class:`OnOtherDevice` tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and _device_named(tree_flatten((args, kwargs))[0]) == "cuda":
            rest = [a for a in args[1:] if not isinstance(a, (str, torch.device))]
            kw = {k: v for k, v in kwargs.items() if k != "device"}
            return args[0].to(*rest, **kw).as_subclass(OnOtherDevice)
        return func(*args, **kwargs)


def elsewhere(draft: DraftTree) -> DraftTree:
    probs = None if draft.draft_probs is None else draft.draft_probs.as_subclass(OnOtherDevice)
    return DraftTree(draft.token_ids.as_subclass(OnOtherDevice), draft.parent.as_subclass(OnOtherDevice), probs)


class Elsewhere:
    """Wraps a proposer: its drafts come back on the simulated device."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.produces_trees = getattr(inner, "produces_trees", False)

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def propose(self, state, budget):
        return elsewhere(self.inner.propose(state, budget))


def test_the_simulated_device_raises_as_a_cuda_tensor_does():
    ids = torch.tensor([[3, 4]]).as_subclass(OnOtherDevice)
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([torch.tensor([[1]]), ids], 1)
    assert ids.device.type == "cuda" and ids.cpu().tolist() == [[3, 4]] and type(ids.cpu()) is torch.Tensor


@pytest.mark.parametrize("make", [ScriptedChain, ScriptedTree], ids=["chain", "tree"])
def test_a_draft_on_another_device_is_verified_not_refused(llama_target, make):
    n = 16
    reference = hf_greedy(llama_target.model, PROMPT, n)
    proposer = Elsewhere(make(llama_target, reference))
    result = Engine(llama_target, [proposer], GreedyVerifier()).generate(PROMPT, max_new_tokens=n)
    assert result.token_ids == reference
    m = result.metrics
    check_metrics(result)
    assert m.accepted_nodes >= n // 2  # the drafts were verified and taken, not dropped
    assert m.proposer_faults == 0 and not m.proposer_fault_kinds


def test_draft_probs_on_another_device_reach_the_verifier(llama_target):
    """Sampling: a chain with q rows on the simulated device is checked and verified (q stays where it was made
    until the verifier reads it)."""
    n = 8
    reference = hf_greedy(llama_target.model, PROMPT, n)

    class WithProbs(ScriptedChain):
        def propose(self, state, budget):
            d = super().propose(state, budget)
            q = torch.full((d.num_nodes, VOCAB), 1.0 / VOCAB)
            return DraftTree.chain(d.token_ids[0], q)

    proposer = Elsewhere(WithProbs(llama_target, reference))

    engine = Engine(llama_target, [proposer], SpeculativeSamplingVerifier())
    with SimulatedCuda():
        result = engine.generate(PROMPT, max_new_tokens=n, sampling=SamplingParams(temperature=1.0), seed=3)
    assert len(result.token_ids) == n
    assert result.metrics.proposer_faults == 0 and result.metrics.drafted_nodes > 0


def test_the_scorer_hands_its_forward_tensors_on_its_device(llama_target):
    """Placement on ``meta``: a CPU draft and newest token reach the target's forward on the target's device."""
    seen: list[str] = []

    class OnMeta:
        device, dtype = torch.device("meta"), torch.float32

        def new_cache(self):
            return None

        def forward(self, ids, cache, want_hidden=False, **kw):
            tensors = [ids, *(v for v in kw.values() if isinstance(v, torch.Tensor))]
            seen.extend(t.device.type for t in tensors)
            return torch.empty((1, ids.shape[1], VOCAB), device="meta"), None

    scorer = TargetScorer(OnMeta(), (), False)
    scorer.cache = None
    import specframe.decode.target_scorer as ts

    ts_cache_length = ts.cache_length
    try:
        ts.cache_length = lambda cache: 5
        scorer.score(torch.tensor([[1]]), DraftTree.chain([2, 3]))
        scorer.score(torch.tensor([[1]]), DraftTree.from_lists([2, 3, 4], [-1, -1, 0]))
    finally:
        ts.cache_length = ts_cache_length
    assert seen and set(seen) == {"meta"}, seen


def test_out_of_device_memory_is_a_named_error_not_a_refused_draft(llama_target, monkeypatch):
    n = 8
    reference = hf_greedy(llama_target.model, PROMPT, n)
    engine = Engine(llama_target, [ScriptedChain(llama_target, reference)], GreedyVerifier())
    request = engine.request(PROMPT, max_new_tokens=n)
    request.start()

    def oom(newest, draft):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(request.scorer, "score", oom)
    with pytest.raises(DeviceError, match="ran out of device memory verifying 5 tokens.*lower the draft's size"):
        request.step()
    request.close()


def test_tensors_on_two_devices_in_the_forward_are_a_named_error(llama_target, monkeypatch):
    engine = Engine(llama_target, [ScriptedChain(llama_target, [1, 2, 3, 4])], GreedyVerifier())
    request = engine.request(PROMPT, max_new_tokens=4)
    request.start()
    monkeypatch.setattr(request.scorer, "score", lambda newest, draft: (_ for _ in ()).throw(RuntimeError(_SAME_DEVICE)))
    with pytest.raises(DeviceError, match="two devices"):
        request.step()
    request.close()


def test_on_host_moves_structure_once_and_leaves_probs():
    ids, parent = torch.tensor([[3, 4]]), torch.tensor([[-1, 0]])
    probs = torch.full((1, 2, VOCAB), 1.0 / VOCAB).as_subclass(OnOtherDevice)
    moved = DraftTree(ids.as_subclass(OnOtherDevice), parent.as_subclass(OnOtherDevice), probs).on_host()
    assert type(moved.token_ids) is torch.Tensor and moved.token_ids.tolist() == [[3, 4]]
    assert moved.parent.tolist() == [[-1, 0]] and moved.draft_probs is probs
    plain = DraftTree(ids, parent)
    assert plain.on_host() is plain and plain.to("cpu") is plain
    assert plain.to("meta").token_ids.device.type == "meta"
