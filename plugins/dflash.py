"""``dflash``: a DFlash or DFlash2 block drafter fills a whole block of drafts in one forward (DFlash: "Block
Diffusion for Flash Speculative Decoding", arXiv 2602.06036; the computation and the checkpoint layout are in
:mod:`specframe.learned.dflash`).

The drafter reads the target's hidden states of its ``target_layer_ids`` at every committed position, taken from the
verification forward the engine already runs (``feature_layers``): no extra target forward. It keeps the keys and
values of those context rows in its own cache and, each step, adds the positions committed since the last one, then
runs one forward over the block ``[newest committed token, mask, ..., mask]`` and drafts the chain of the block's
rows:

- **greedy** (temperature 0): each row's argmax (DFlash), or the candidate selector's best chain from the newest
  token (DFlash2). Drafts are deterministic (one-hot q).
- **sampling**: DFlash draws each row from its warped distribution q_i (the request's temperature / top-k / top-p,
  its generator): the rows' distributions do not depend on each other's tokens, so q_i is the distribution of
  token ``i`` given its path, and it is reported as ``draft_probs``. DFlash2 draws row ``i`` from the warped selector
  scores over its candidates given the token drawn at row ``i - 1``, reported the same way (Leviathan et al. 2022,
  Algorithm 1, stays exact either way).

The block: ``k`` (default ``block_size - 1``, at most that) draft rows. When the step's node budget is smaller, the
forward covers ``budget + 1`` draft rows and the chain is cut to ``budget`` — the rows the reference decoding loop
(``dflash_generate``) would draft when ``budget + 1`` tokens are left to generate, so both draft the same blocks up
to the last step. A drafter's block rows see each other (no causal mask), so a shorter block can change every row.

A block proposer (``block_size``, :class:`specframe.Proposer`): the engine asks for the whole block whenever it
runs and the router keeps the prefix the cost curve pays for; ``verify_budget`` caps the nodes by hand. With
``candidates: C > 1`` (greedy, on a target that takes tree masks) each row's ``C - 1`` next best tokens join the
draft as leaves beside the row's best, the tree's nodes chosen by path score (:func:`specframe.services.block_tree`;
DFlash: each row's softmax; DFlash2: the selector's softmax given the chain's token before).

The first step of a request drafts a block after the prompt's last token from the features of the rest of the
prompt; ``first_step: false`` leaves that step to the target alone, as ``dflash_generate`` does (its first token
comes from the prefill), so that step-by-step comparisons line up. A prompt of one token gets no draft in its first
step (no context yet).

Weights: ``checkpoint: DIR``, a drafter in z-lab's layout (``config.json`` + ``model.safetensors``: DFlash's
``DFlashDraftModel`` or DFlash2's ``DFlash2DraftModel``), made for this target: its ``hidden_size``, vocabulary and
``target_layer_ids`` must fit the target (one error line naming the field otherwise). The drafter runs in the
target's dtype and on its device; it borrows the target's input-embedding rows and LM head.
"""

from __future__ import annotations

import math
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
    block_tree,
    folder_key,
    load_dflash,
    probs_from_logits,
    shared,
)

from .weights import weights_folder


class DFlashConfig(ProposerConfig):
    name: Literal["dflash"] = "dflash"
    checkpoint: Optional[str] = Field(
        None, description="Folder of a DFlash or DFlash2 drafter in z-lab's layout (config.json with dflash_config, "
        "model.safetensors), e.g. a local download of z-lab/Qwen3-8B-DFlash-b16; default: the one shipped for the "
        "target.")
    k: Optional[int] = Field(
        None, ge=1, le=255, description="Most tokens drafted per step: the block's draft rows (default and most: the "
        "drafter's block_size - 1).")
    first_step: bool = Field(
        True, description="Draft in a request's first step too (a block after the prompt's last token); false leaves "
        "that step to the target, as the reference decoding loop dflash_generate does.")
    candidates: int = Field(
        1, ge=1, le=16, description="Greedy decoding: tokens per block row offered to the target, the row's best and "
        "candidates - 1 others as leaves beside it, the tree's nodes chosen by path score (1 = a chain; sampling and "
        "targets without tree masks draft a chain).")
    verify_budget: Optional[int] = Field(
        None, ge=1, le=4096, description="Most draft nodes of a block verified per step (SGLang's "
        "--speculative-dflash-verify-budget); default: every node of the block, the router keeping the prefix the "
        "measured cost curve pays for.")


def _load(folder: Any, target: TargetInfo) -> Any:
    """The drafter in ``folder``, checked against the target's shapes, on the target's device and dtype."""
    cfg = target.model.config.get_text_config()
    rows = int(target.model.get_input_embeddings().weight.shape[0])
    d = load_dflash(folder, int(cfg.hidden_size), target.vocab_size, int(cfg.num_hidden_layers), rows)
    return d.to(device=target.device, dtype=target.dtype)


class DFlashProposer(ProposerBase):
    """DFlash / DFlash2 block drafter -> a draft chain from one forward (see the module docstring)."""

    name = "dflash"
    Config = DFlashConfig
    needs_hidden_states = False
    reads_features = True  # which layers: the instance's feature_layers, from the drafter's config
    produces_trees = True  # with candidates > 1 (greedy): the chain and per-row candidates, best paths first
    provides_draft_probs = True

    def __init__(self, config: DFlashConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        if target.model is None:
            raise ConfigError(f"dflash needs the target model (its hidden-state features, embeddings and LM head), "
                              f"which this target (engine {target.engine}) does not give: use engine transformers")
        folder = weights_folder(
            config.checkpoint, target.name, "dflash", "DFlash drafter is",
            "point `checkpoint: DIR` at a DFlash or DFlash2 drafter in z-lab's layout made for this model",
        )
        # the drafter is loaded once per folder and placement, shared by every option set
        key = ("dflash", folder_key(folder), str(target.dtype), str(target.device), id(target.model))
        self.drafter = shared(key, lambda: _load(folder, target))
        self.feature_layers = tuple(self.drafter.feature_layers)
        self.table = target.model.get_input_embeddings().weight  # [V, H], read-only
        self.head = target.model.get_output_embeddings()
        self.rows = min(config.k or self.drafter.block_size - 1, self.drafter.block_size - 1)  # draft rows at most
        self.block_size = self.rows + 1  # a block proposer (Capabilities.block_size): one forward fills this block
        self.others = config.candidates - 1 if target.supports_trees else 0  # candidates beside each row's best
        self.nodes = config.verify_budget or self.rows * (1 + self.others)  # most nodes verified per step
        self._kv = self.drafter.new_kv()  # the context rows' keys / values, then this step's block rows
        self._done = 0  # committed positions whose context rows are in the cache

    def start(self, state: DecodeState) -> None:
        self._done = 0

    @torch.inference_mode()
    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        batch = state.tokens.shape[0]
        feats = state.features
        length = int(state.tokens.shape[1])
        if feats is None or feats.shape[1] == 0 or (not self.config.first_step and length <= state.prompt_len):
            return DraftTree.empty(batch)
        n = min(self.rows, budget + 1)  # draft rows in this forward (see the module docstring)
        room = self.target.max_context - length  # positions left: the deepest node must fit
        keep = min(n, budget, room, self.nodes)
        if keep < 1:
            return DraftTree.empty(batch)
        rows, logits = self._block(state, n)
        anchor = state.tokens[:1, -1].to(rows.device)
        if not state.sampling.is_greedy:
            return self._sampled(state, rows, logits, keep)
        if not self.others:
            return DraftTree.chain(self.drafter.draft_greedy(rows, logits, anchor)[0, :keep].cpu())
        depth = min(n, room)  # rows whose tokens may enter the tree
        chain, chain_s, cands, cand_s = self.drafter.draft_scored(rows[:, :depth], logits[:, :depth], anchor,
                                                                  self.others)
        return block_tree(chain, chain_s.clamp(0, 1), cands, cand_s.clamp(0, 1), min(budget, self.nodes))

    def _block(self, state: DecodeState, n: int) -> tuple[Tensor, Tensor]:
        """One drafter forward over ``[newest token] + n masks`` after catching the cache up with the committed
        positions. Returns the draft rows' outputs ``[1, n, H]`` and logits ``[1, n, V]``."""
        dev = self.target.device
        feats = state.features
        done = int(feats.shape[1])  # positions 0 .. T-2: every committed token but the newest
        if self._done > done:  # should not happen (positions are only added); start over
            self._done = 0
        cols = [state.feature_layers.index(i) for i in self.feature_layers]
        ctx = self.drafter.fuse(feats[:1, self._done : done][:, :, cols].to(dev))
        block = torch.full((1, 1 + n), self.drafter.mask_token_id, dtype=torch.int64, device=dev)
        block[0, 0] = state.tokens[0, -1]
        out = self.drafter(ctx, self.drafter.embed(block, self.table), self._done, self._kv)
        self._done = done
        rows = out[:, 1:]
        return rows, self.drafter.logits(rows, self.head)

    def _sampled(self, state: DecodeState, rows: Tensor, logits: Tensor, keep: int) -> DraftTree:
        """A chain of ``keep`` tokens drawn with the request's warp and generator, with the distributions drawn from
        as ``draft_probs``."""
        selector = self.drafter.candidate_selector
        if selector is not None:
            unary, cand = selector.candidates(logits)  # (in the drafter's dtype, as the greedy chain)
            projected = selector.hidden_projection(rows)
            prev = state.tokens[:1, -1].to(rows.device)
        drafted: list[int] = []
        probs: list[Tensor] = []
        for i in range(keep):
            if selector is None:
                scores = logits[0, i].float()
            else:  # the selector's scores over row i's candidates given the token before; -inf elsewhere
                s = selector.scores(projected[:, i], prev, unary[:, i], cand[:, i]).float()[0]
                scores = torch.full_like(logits[0, i], float("-inf"), dtype=torch.float32).index_copy_(
                    0, cand[0, i], s)
            q = probs_from_logits(scores, state.sampling)
            if not bool(torch.isfinite(q).all()) or not math.isclose(float(q.sum()), 1.0, rel_tol=1e-3):
                break  # a degenerate warp (e.g. top-k over tokens the selector never offers): draft what we have
            tok = int(torch.multinomial(q.to(state.generator.device), 1, generator=state.generator))
            drafted.append(tok)
            probs.append(q.cpu())
            if selector is not None:
                prev = torch.tensor([tok], device=rows.device)
        if not drafted:
            return DraftTree.empty(state.tokens.shape[0])
        return DraftTree.chain(drafted, torch.stack(probs))


@hookimpl
def specframe_register_proposers(register) -> None:
    register(DFlashProposer)
