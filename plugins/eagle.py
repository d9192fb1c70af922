"""``eagle``: an EAGLE-style feature-level drafter with a dynamic draft tree (Li et al. 2024, EAGLE; EAGLE-2,
dynamic trees; EAGLE-3, multi-layer feature fusion; see :mod:`specframe.learned.eagle_drafter`).

The drafter reads the target's hidden states of a low, a middle and a high layer at every committed position,
taken from the verification forward the engine already runs (``feature_layers``): no extra target forward. It
keeps its own small KV cache over the committed positions and, each step, catches up on the positions committed
since the last one, then drafts:

- **greedy** (temperature 0) and a tree-capable target: an EAGLE-2 dynamic tree. Starting from the drafter's
  distribution after the newest token, each level expands the ``top_k`` most likely nodes so far (likelihood =
  product of the drafter's probabilities along the path) with their ``top_k`` best children, in one drafter pass
  per level, for ``depth`` levels; then the ``max_nodes`` (or the step's budget) most likely nodes of everything
  drafted are verified. The levels stop early once ``max_nodes`` drafted nodes are at least as likely as the best
  node left to expand (no deeper node could be kept: the same tree, fewer drafter passes). Drafts are
  deterministic (one-hot q), so output is the target's greedy output.
- **sampling**: a chain of ``depth`` tokens drawn from the drafter's warped distribution q (the request's
  temperature / top-k / top-p, its generator), with q as ``draft_probs`` for exact rejection sampling
  (Leviathan et al. 2022, Algorithm 1). q is zero outside the head's token subset, which the acceptance rule
  handles exactly.
- a target that cannot take tree masks (sliding-window attention), or ``top_k: 1``: the greedy chain.

The output head scores the target's own LM-head rows of the ``S`` most frequent corpus tokens (FR-Spec); tokens
outside are never drafted. Near the end of the target's context the tree is made shallower; a prompt of one
token (nothing processed yet) gets no draft in its first step.

Weights: ``weights: DIR`` (written by ``specframe train eagle``), or by default the drafter shipped for the target
(see ``specframe_plugins/weights/<target>/eagle/README.md``). ``checkpoint: DIR`` reads a published EAGLE-3 drafter
(EAGLE-3 native or speculators layout, :mod:`specframe.learned.eagle3`): the same tree and chain drafting, with the
checkpoint's own 2H-input layer, embedding (or the target's), LM head over its draft vocabulary (``d2t``) and tapped
layers.
"""

from __future__ import annotations

import heapq
from typing import Any, Literal, Optional

import torch
from pydantic import Field
from torch import Tensor

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    hookimpl,
)
from specframe.services import (
    EagleDrafter,
    KVBuffer,
    folder_key,
    load_eagle3,
    probs_from_logits,
    shared,
)

from .weights import weights_folder


class EagleConfig(ProposerConfig):
    name: Literal["eagle"] = "eagle"
    weights: Optional[str] = Field(None, description="Folder of a trained drafter; default: the one shipped for the target.")
    checkpoint: Optional[str] = Field(
        None, description="Folder of a published EAGLE-3 drafter (EAGLE-3 native or speculators layout, e.g. a "
        "local download of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B); specframe's own format is read here too.")
    depth: int = Field(6, ge=1, le=32, description="Draft levels (longest path; the chain length under sampling).")
    top_k: int = Field(4, ge=1, le=16, description="Nodes expanded per level and children per expanded node.")
    max_nodes: int = Field(16, ge=1, le=256, description="Most tree nodes per step (the verification width).")


class _OwnFormat:
    """specframe's own drafter (``eagle.json``) behind the interface :class:`EagleProposer` drives (the one
    :class:`specframe.learned.eagle3.Eagle3Drafter` has): ``feature_layers``, ``token_map``, ``new_kv``, ``fuse``,
    ``step``, ``logits``. It borrows the target's input embeddings and the LM-head rows of its token subset."""

    def __init__(self, folder: Any, target: TargetInfo) -> None:
        head = target.model.get_output_embeddings().weight
        self.drafter = EagleDrafter.load(folder, int(head.shape[1]), target.vocab_size).to(
            device=target.device, dtype=target.dtype)
        self.embed = target.model.get_input_embeddings()  # (keeps the target model, part of the key, alive)
        self.token_map = self.drafter.token_map.to(target.device)
        self.head_rows = head.detach()[self.token_map].to(target.dtype).contiguous()  # [S, H]
        self.feature_layers = tuple(self.drafter.spec.feature_layers)

    def new_kv(self) -> KVBuffer:
        return KVBuffer()

    def fuse(self, feats: Tensor) -> Tensor:
        return self.drafter.fuse_features(feats)

    def step(self, g: Tensor, tokens: Tensor, positions: Tensor, mask: Tensor, kv: KVBuffer, at: int):
        return self.drafter.step(g, self.embed(tokens), positions, None, mask, kv, at)

    def logits(self, a: Tensor) -> Tensor:
        return self.drafter.logits(a, self.head_rows)


def _load(folder: Any, target: TargetInfo) -> Any:
    """The drafter in ``folder``, read-only after loading: specframe's format (``eagle.json``), else a published
    EAGLE-3 checkpoint (``config.json``), on the target's device and dtype."""
    if not (folder / "eagle.json").is_file() and not (folder / "config.json").is_file():
        raise ConfigError(f"{folder} holds no EAGLE drafter: it needs eagle.json (specframe's format) or config.json "
                          f"(an EAGLE-3 native or speculators checkpoint)")
    if (folder / "eagle.json").is_file():
        return _OwnFormat(folder, target)
    cfg = target.model.config.get_text_config()
    d = load_eagle3(folder, int(cfg.hidden_size), target.vocab_size, int(cfg.num_hidden_layers), target.name,
                    str(getattr(target.model.config, "_name_or_path", "") or ""))
    d = d.to(device=target.device, dtype=target.dtype)
    if d.embed_tokens is None:
        d.target_embed = target.model.get_input_embeddings()
    return d


class EagleProposer(ProposerBase):
    """EAGLE drafter -> dynamic token tree (greedy) or sampled chain (see the module docstring)."""

    name = "eagle"
    Config = EagleConfig
    needs_hidden_states = False
    reads_features = True  # which layers: the instance's feature_layers, from the drafter's weights
    produces_trees = True
    provides_draft_probs = True

    def __init__(self, config: EagleConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        if target.model is None:
            raise ConfigError(f"eagle needs the target model (its hidden-state features, embeddings and LM head), which "
                              f"this target (engine {target.engine}) does not give: use engine transformers for eagle")
        if config.weights and config.checkpoint:
            raise ConfigError("eagle takes `weights` or `checkpoint`, not both (both name the drafter's folder)")
        folder = weights_folder(
            config.checkpoint or config.weights, target.name, "eagle", "EAGLE drafter is",
            "train one with `specframe train eagle` and set `weights: DIR`, or point `checkpoint: DIR` at a "
            "downloaded EAGLE-3 drafter",
        )
        # the drafter (and LM-head rows) are loaded once per folder and placement, shared by every option set
        key = ("eagle", folder_key(folder), str(target.dtype), str(target.device), id(target.model))
        self.drafter = shared(key, lambda: _load(folder, target))
        self.token_map = self.drafter.token_map  # [S] target ids of the draft vocabulary
        self.feature_layers = tuple(self.drafter.feature_layers)
        self.trees = bool(target.supports_trees)
        self._kv = self.drafter.new_kv()  # the drafter's keys / values: committed positions, then tree entries
        self._done = 0  # committed positions whose drafter entries are in the cache
        self._last: Tensor | None = None  # [1, H] drafter output at the last cached position

    def start(self, state: DecodeState) -> None:
        self._done, self._last = 0, None

    # --- the drafter's cache over committed positions --------------------------------------------------------
    def _catch_up(self, state: DecodeState) -> bool:
        feats = state.features
        if feats is None or feats.shape[1] == 0:
            return False
        t_f = int(feats.shape[1])
        if self._done > t_f:  # should not happen (positions are only added); start over
            self._done = 0
        if self._done == t_f:
            return self._last is not None
        cols = [state.feature_layers.index(i) for i in self.feature_layers]
        dev = self.target.device
        f = feats[:1, self._done : t_f][:, :, cols].to(dev)  # [1, n, F, H]
        nxt = state.tokens[:1, self._done + 1 : t_f + 1].to(dev)  # the token after each position
        pos = torch.arange(self._done, t_f, device=dev)[None]
        g = self.drafter.fuse(f)
        n = t_f - self._done
        mask = torch.ones((n, t_f), dtype=torch.bool, device=dev)  # every cached position, causal among the new
        mask[:, self._done :] = torch.ones((n, n), dtype=torch.bool, device=dev).tril()
        a, _ = self.drafter.step(g, nxt, pos, mask, self._kv, self._done)
        self._done, self._last = t_f, a[:, -1]
        return True

    def _level(self, parents_a: Tensor, tokens: list[int] | Tensor, positions: list[int], ancestors: list[list[int]],
               n_tree: int) -> Tensor:
        """One drafter pass over ``m`` tree entries (``parents_a [m, H]``, their tokens and positions), written to the
        cache after the committed entries and the ``n_tree`` tree entries of earlier levels; entry ``r`` attends to
        every committed entry, to the tree entries ``ancestors[r]`` (indices in the order written) and to itself.

        ``tokens``: ``m`` ints, or an ``[m]`` int64 tensor (a token sampled on the device stays there). One copy to
        the device per pass: the tokens (when ints), the positions and the ``[m, n_tree + m]`` tree block of the
        mask, packed in one int64 tensor; the committed block (all True) is filled on the device."""
        dev = self.target.device
        m, base, width = len(positions), self._done, n_tree + len(positions)
        block = [0] * (m * width)  # [m, n_tree + m] row-major: entry r may attend to tree entry j
        for r, anc in enumerate(ancestors):
            for j in anc:
                block[r * width + j] = 1
            block[r * width + n_tree + r] = 1
        host_tokens = not isinstance(tokens, Tensor)
        packed = torch.tensor((list(tokens) if host_tokens else []) + list(positions) + block, dtype=torch.int64,
                              device=dev)
        if host_tokens:
            tok, packed = packed[:m], packed[m:]
        else:
            tok = tokens if tokens.device == dev else tokens.to(dev)
        pos, tree = packed[:m], packed[m:].view(m, width).bool()
        mask = torch.cat([torch.ones((m, base), dtype=torch.bool, device=dev), tree], 1)
        a, _ = self.drafter.step(parents_a[None], tok.reshape(1, m), pos[None], mask, self._kv, base + n_tree)
        return a[0]

    @staticmethod
    def _read_scored(values: Tensor, ids: Tensor) -> tuple[list, list]:
        """``values`` float and ``ids`` int64 of one shape (``[k]`` or ``[m, k]``) as nested Python lists, in one
        host read: both travel as float64 (exact for float32 scores and for token ids below 2**53)."""
        both = torch.stack([values.double(), ids.double()]).tolist()
        ints = [int(x) for x in both[1]] if values.dim() == 1 else [[int(x) for x in row] for row in both[1]]
        return both[0], ints

    # --- drafting ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        batch = state.tokens.shape[0]
        if not self._catch_up(state):
            return DraftTree.empty(batch)
        length = int(state.tokens.shape[1])
        depth = min(self.config.depth, self.target.max_context - length, budget)
        if depth < 1:
            return DraftTree.empty(batch)
        if not state.sampling.is_greedy:
            return self._sampled_chain(state, min(depth, budget))
        k = self.config.top_k if self.trees else 1
        return self._tree(length, depth, k, min(budget, self.config.max_nodes) if k > 1 else min(budget, depth))

    def _tree(self, length: int, depth: int, k: int, max_nodes: int, prune: bool = True) -> DraftTree:
        """EAGLE-2: expand the ``k`` most likely nodes per level, keep the ``max_nodes`` most likely overall.

        ``prune``: stop expanding once no deeper node can be kept: a child is at most as likely as its parent and
        loses ties to shallower nodes, so when ``max_nodes`` nodes already drafted are at least as likely as the
        best node to expand, the levels below cannot change the tree (the same tree, fewer drafter passes)."""
        logp = torch.log_softmax(self.drafter.logits(self._last).float(), -1)[0]  # [S]
        top = logp.topk(min(k, logp.numel()))
        tm = self.token_map  # [S] on the device: head index -> target token id, mapped before the host read
        scores, ids = self._read_scored(top.values, tm[top.indices])
        # node: (score, token, parent node or -1, depth); nodes are created parents first
        nodes: list[tuple[float, int, int, int]] = [(s, t, -1, 1) for s, t in zip(scores, ids)]
        frontier = list(range(len(nodes)))
        out_a: dict[int, Tensor] = {}  # node -> drafter output of its entry
        entry_of: dict[int, int] = {}  # node -> index of its entry among tree entries
        n_entries = 0
        for level in range(1, depth):
            frontier = heapq.nlargest(k, frontier, key=lambda i: nodes[i][0])
            if not frontier:
                break
            if prune and len(nodes) >= max_nodes:
                best = nodes[frontier[0]][0]
                if sum(1 for nd in nodes if nd[0] >= best) >= max_nodes:
                    break  # no descendant of the frontier can be among the max_nodes most likely
            parents_a = torch.stack([self._last[0] if nodes[i][2] < 0 else out_a[nodes[i][2]] for i in frontier])
            ancestors = []
            for i in frontier:
                anc, p = [], nodes[i][2]
                while p >= 0:
                    anc.append(entry_of[p])
                    p = nodes[p][2]
                ancestors.append(anc)
            a = self._level(parents_a, [nodes[i][1] for i in frontier], [length - 1 + level - 1] * len(frontier),
                            ancestors, n_entries)
            for r, i in enumerate(frontier):
                out_a[i], entry_of[i] = a[r], n_entries + r
            n_entries += len(frontier)
            lp = torch.log_softmax(self.drafter.logits(a).float(), -1)  # [m, S]
            best = lp.topk(min(k, lp.shape[-1]), dim=-1)
            scores, ids = self._read_scored(best.values, tm[best.indices])  # the level's one host read
            new = []
            for r, i in enumerate(frontier):
                for s, t in zip(scores[r], ids[r]):
                    new.append(len(nodes))
                    nodes.append((nodes[i][0] + s, t, i, level + 1))
            frontier = new
        # the most likely nodes overall; a parent is at least as likely as its children, and ties go to the
        # shallower node, so the chosen set contains every chosen node's ancestors
        order = sorted(range(len(nodes)), key=lambda i: (-nodes[i][0], nodes[i][3], i))[:max_nodes]
        order.sort(key=lambda i: (nodes[i][3], -nodes[i][0], i))  # topological: by depth
        index = {node: n for n, node in enumerate(order)}
        ids = [nodes[i][1] for i in order]
        parents = [index[nodes[i][2]] if nodes[i][2] >= 0 else -1 for i in order]
        return DraftTree.from_lists(ids, parents)

    def _sampled_chain(self, state: DecodeState, depth: int) -> DraftTree:
        """A chain of up to ``depth`` tokens sampled from q. Per token one host read (q's sanity check, which decides
        whether to go on); the tokens stay on the device until the chain ends (one read), and q rows are moved to
        the host once, stacked."""
        v, dev = self.target.vocab_size, self.target.device
        a_prev, length = self._last, int(state.tokens.shape[1])
        drafted: list[Tensor] = []  # [1] int64 each, on the generator's device
        probs: list[Tensor] = []
        for d in range(depth):
            sub = self.drafter.logits(a_prev).float()[0]  # [S]
            full = torch.full((v,), float("-inf"), dtype=torch.float32, device=dev).index_copy_(0, self.token_map, sub)
            q = probs_from_logits(full, state.sampling)
            if not bool(_usable(q)):
                break  # a degenerate warp (e.g. top-k over tokens the head cannot draft): draft what we have
            qg = q if q.device == state.generator.device else q.to(state.generator.device)
            tok = torch.multinomial(qg, 1, generator=state.generator)
            drafted.append(tok)
            probs.append(q)
            if d + 1 < depth:
                a_prev = self._level(a_prev, tok, [length - 1 + d], [list(range(d))], d)
        if not drafted:
            return DraftTree.empty(state.tokens.shape[0])
        q_rows = torch.stack(probs)
        return DraftTree.chain(torch.cat(drafted).tolist(), q_rows if q_rows.device.type == "cpu" else q_rows.cpu())


def _usable(q: Tensor) -> Tensor:
    """``q [V]`` float32 -> a 0-dim bool tensor on q's device: every entry finite and the sum within a relative
    1e-3 of 1, computed as ``math.isclose(float(q.sum()), 1.0, rel_tol=1e-3)`` does (float32 sum, then float64)."""
    total = q.sum().double()
    return torch.isfinite(q).all() & ((total - 1.0).abs() <= 1e-3 * torch.clamp(total.abs(), min=1.0))


@hookimpl
def specframe_register_proposers(register) -> None:
    register(EagleProposer)
