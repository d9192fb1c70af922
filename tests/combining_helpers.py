"""Builders shared by the tests of combining several proposers (test_merge_*.py, test_routers.py,
test_combined_*.py, test_combining_faces.py): drafts, step reports, scripted proposers and the per-architecture
environments (target, greedy references, an HF draft folder)."""

from __future__ import annotations

from pathlib import Path

import torch

from specframe import DraftTree, ProposerBase, ProposerConfig
from specframe.contracts.combining import ProposerStep
from specframe.target.hf import Target
from specframe_plugins.merge_policies import ConfidenceConfig, ConfidencePolicy, PriorityConfig, PriorityPolicy

from tests.fakes import ARCHS, PROMPT, PROMPT_2, VOCAB, build_model, build_tokenizer, hf_greedy

N_NEW = 32


def chain(ids, probs=None) -> DraftTree:
    return DraftTree.chain(ids, probs)


def tree(ids, parents, probs=None) -> DraftTree:
    return DraftTree(torch.tensor([ids]), torch.tensor([parents]), None if probs is None else probs[None])


def step(name, drafted=0, accepted=0, asked=True, budget=8, proposed=None, depths=None, draft_s=0.001):
    proposed = drafted if proposed is None else proposed
    depths = tuple([1] * drafted) if depths is None else depths
    return ProposerStep(name, asked, budget if asked else 0, proposed, drafted, depths, accepted, accepted, draft_s,
                        False)


# --- proposers for the engine tests -----------------------------------------------------------------------------------


class ScriptedTree(ProposerBase):
    """A deterministic tree: a wrong branch first, then ``good`` correct tokens of the reference under the second
    root child. On a target that cannot take trees it drafts the correct chain."""

    name = "scripted-tree"
    produces_trees = True

    def __init__(self, target, reference: list[int], good: int = 3) -> None:
        super().__init__(ProposerConfig(name=self.name), target)
        self.reference, self.good = reference, good

    def propose(self, state, budget):
        done = state.num_generated
        right = self.reference[done : done + self.good]
        if not right:
            return DraftTree.empty()
        if not self.target.supports_trees:
            return chain(right)
        wrong = [(t + 1) % VOCAB for t in right]
        ids = [wrong[0], right[0]] + right[1:] + wrong[1:2]
        parents = [-1, -1] + list(range(1, len(right))) + [0][: len(wrong[1:2])]
        return tree(ids, parents).truncate(budget)


class ScriptedChain(ProposerBase):
    """Drafts ``k`` tokens of the reference, the ones from ``correct`` on made wrong."""

    name = "scripted"

    def __init__(self, target, reference: list[int], k: int = 4, correct: int | None = None, name: str = "scripted"):
        super().__init__(ProposerConfig(name=name), target)
        self.name = name
        self.reference, self.k, self.correct = reference, k, correct

    def propose(self, state, budget):
        done = state.num_generated
        draft = self.reference[done : done + min(self.k, budget)]
        c = len(draft) if self.correct is None else self.correct
        return chain(draft[:c] + [(t + 1) % VOCAB for t in draft[c:]]) if draft else DraftTree.empty()


def draft_dir(root: Path, arch: str) -> Path:
    """A different tiny random model with the same vocabulary: an HF draft for the draft-model proposer."""
    folder = root / f"draft-{arch}"
    if not folder.exists():
        build_model(arch, seed=1).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    return folder


def combining_envs(tmp_path_factory) -> dict:
    """Per architecture: (target, greedy references of PROMPT and PROMPT_2, a draft folder). Test modules wrap it
    in a module-scoped ``envs`` fixture."""
    root = tmp_path_factory.mktemp("combining")
    out = {}
    for arch in ARCHS:
        model = build_model(arch)
        target = Target(model, build_tokenizer(), name="specframe-test-combining")
        refs = [hf_greedy(model, p, N_NEW + 8) for p in (PROMPT, PROMPT_2)]
        out[arch] = (target, refs, draft_dir(root, arch))
    return out


def policy_of(name: str, max_nodes: int = 12):
    if name == "priority":
        return PriorityPolicy(PriorityConfig(max_nodes=max_nodes))
    return ConfidencePolicy(ConfidenceConfig(max_nodes=max_nodes))
