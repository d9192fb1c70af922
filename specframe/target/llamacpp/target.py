"""The llama.cpp target: a GGUF run by llama.cpp's CPU kernels behind the engine's target and scorer contracts.

:class:`LlamaCppTarget` is what :class:`specframe.target.hf.Target` is for transformers: the tokenizer side (a
transformers tokenizer read from the GGUF, so prompts encode exactly as on the transformers engine) and the model
side (llama.cpp contexts). :class:`LlamaCppScorer` is one request's KV cache: a llama.cpp context whose sequence 0
holds every committed token but the newest (the engine's KV invariant); each step decodes ``[newest] + draft`` in one
``llama_decode`` with a logits row per token, then removes the rejected cells (``llama_memory_seq_rm``).

Trees: llama.cpp can verify a token tree in one batch (a sequence id per leaf, a node carrying the ids of the leaves
below it), but the accepted path's cells then lie between removed ones and attention sums them in another order
than one-token decoding would: not bit-exact. So this target verifies chains (``supports_trees`` False: tree
proposers' drafts keep their leading chain) unless ``trees=True`` is asked for (docs/llamacpp.md, "Exactness").
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...contracts import DraftTree, TargetInfo
from ...contracts.scoring import Scored
from ...errors import ConfigError
from ..hf import TextSide
from .binding import N_BATCH, BuildInfo, LlamaContext, LlamaModel, build_info

ENGINE = "llama.cpp"
DEFAULT_N_CTX = 8192  # KV cells per request at most (the model's training context when smaller)
MAX_TREE_SEQS = 16  # leaves of a verified token tree (sequence ids per context) when trees are on


class LlamaCppTarget(TextSide):
    """A GGUF on llama.cpp as the speculative-decoding target.

    Args:
        gguf: the ``.gguf`` file.
        tokenizer: its transformers tokenizer (prompts, text, stop strings).
        name: display name.
        threads: llama.cpp threads.
        n_ctx: KV cells per request (None: ``min(the model's training context, 8192)``).
        trees: verify token trees in one batch (not bit-exact, see the module docstring).
        build: the llama.cpp build's features (None: read them).
        llama: ``gguf`` already loaded (None: load it).

    Raises:
        ConfigError: llama-cpp-python is missing or too old, or llama.cpp cannot load ``gguf``.
    """

    engine = ENGINE

    def __init__(self, gguf: Path, tokenizer: Any, name: str = "", threads: int = 1, n_ctx: int | None = None,
                 trees: bool = False, build: BuildInfo | None = None, llama: LlamaModel | None = None) -> None:
        self.build = build or build_info()
        self.llama = llama or LlamaModel(Path(gguf))
        self.gguf = Path(gguf)
        self.tokenizer = tokenizer
        self.model = None  # no torch module: proposers that reuse the target's weights cannot run here
        self.name = name or self.gguf.stem
        self.device, self.dtype = torch.device("cpu"), torch.float32  # logits come back as float32
        self.vocab_size = self.llama.n_vocab
        train = self.llama.n_ctx_train or DEFAULT_N_CTX
        self.n_ctx = int(n_ctx or min(train, DEFAULT_N_CTX))
        self.max_context = self.n_ctx
        self.eos_token_ids = _eos_ids(tokenizer, self.llama)
        self.supports_trees = bool(trees)
        self.tree_obstacle = None if trees else "llama.cpp verifies chains bit-exactly only (engine option trees)"
        self.threads = int(threads)
        self.info = TargetInfo(
            vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids, max_context=self.max_context,
            device=self.device, dtype=self.dtype, name=self.name, tokenizer=tokenizer, model=None,
            supports_trees=self.supports_trees, engine=ENGINE)
        self.settings: Any = None  # specframe.target.profile.Settings (threads and why) when loaded by load_target
        self.governor: Any = None
        self.row_check: dict[str, Any] | None = None  # the load-time batch-invariance check (loader)
        self.weights, self.weights_why = "gguf", "as given"  # the tensor types run (llamacpp weights) and why
        self._idle: list[LlamaContext] = []  # contexts of finished requests, reused by later ones
        self._lock = threading.Lock()

    # --- machine ------------------------------------------------------------------------------------------
    def attach_machine(self, settings: Any, governor: Any) -> None:
        """Record how this target runs here; ``info.cost`` is the live cost curve."""
        self.settings, self.governor = settings, governor
        self.info = replace(self.info, cost=governor.curve if governor.curve else None)

    def set_threads(self, threads: int) -> None:
        """llama.cpp threads for the next decodes (the thread governor calls this)."""
        self.threads = int(threads)

    # --- contexts -----------------------------------------------------------------------------------------
    def take_context(self) -> LlamaContext:
        """An empty context for one request (a finished request's, or a new one)."""
        with self._lock:
            ctx = self._idle.pop() if self._idle else None
        if ctx is None:
            ctx = LlamaContext(self.llama, self.n_ctx, N_BATCH, self.threads,
                               MAX_TREE_SEQS if self.supports_trees else 1, padding=self.build.row_padding)
        ctx.clear()
        ctx.set_threads(self.threads)
        return ctx

    def give_context(self, ctx: LlamaContext) -> None:
        with self._lock:
            if len(self._idle) < 4:
                self._idle.append(ctx)
                return
        ctx.close()

    def new_scorer(self, layers: tuple[int, ...], want_hidden: bool) -> "LlamaCppScorer":
        """The scorer of one request (:class:`specframe.contracts.Scorer`).

        Raises:
            ConfigError: hidden states or features were asked for (llama.cpp's API does not give them here).
        """
        if layers or want_hidden:
            raise ConfigError("the llama.cpp engine gives no hidden states: proposers that read them (medusa, "
                              "eagle) need engine transformers")
        return LlamaCppScorer(self)

    def new_batch(self, rows: int) -> Any:
        """Up to ``rows`` requests in one ``llama_decode`` per step (:mod:`specframe.target.llamacpp.batch`); None
        with token trees on (their sequence ids are the tree's: one decode per request then)."""
        if self.supports_trees:
            return None
        from .batch import LlamaCppBatch

        return LlamaCppBatch(self, rows)

    def new_cache(self) -> Any:  # (the contract's name for a request's KV state)
        return self.take_context()

    def forward(self, input_ids: Tensor, cache: Any, want_hidden: bool = False, logits_to_keep: int = 0,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None) -> tuple[Tensor, None]:
        """One decode of ``input_ids [1, n]`` after what ``cache`` (a context from :meth:`new_cache`) holds in
        sequence 0, at consecutive positions. Returns ``(logits [1, n or logits_to_keep, V] float32, None)``."""
        if attention_mask is not None or want_hidden:
            raise ConfigError("the llama.cpp target's forward takes chains only and gives no hidden states")
        ids = input_ids[0].tolist()
        start = _seq_length(cache)
        rows = [cache.decode(ids[i:i + N_BATCH], list(range(start + i, start + min(i + N_BATCH, len(ids)))),
                             logits="all" if not logits_to_keep else "last")
                for i in range(0, len(ids), N_BATCH)]
        logits = torch.cat(rows, 0) if not logits_to_keep else rows[-1]
        return logits[-logits_to_keep:].unsqueeze(0) if logits_to_keep else logits.unsqueeze(0), None

    def rollback(self, cache: LlamaContext, length: int) -> None:
        """Keep the first ``length`` positions of sequence 0 in ``cache`` (a context from :meth:`new_cache`)."""
        cache.remove(0, length)

    def last_logits(self, ids: list[int]) -> Tensor:
        """``[V]`` float32: the target's logits after ``ids``, decoded as plain decoding does (prefill of all but
        the newest token, then the newest alone)."""
        ctx = self.take_context()
        try:
            if len(ids) > 1:
                self.forward(torch.tensor([ids[:-1]]), ctx, logits_to_keep=1)
            return ctx.decode([ids[-1]], [len(ids) - 1], logits="last")[0]
        finally:
            self.give_context(ctx)

    def describe(self) -> dict[str, Any]:
        """The engine, model and build, for ``--json`` records and bench reports."""
        out = {"engine": ENGINE, "gguf": self.gguf.name, "model": self.llama.description, "n_ctx": self.n_ctx,
               "trees": self.supports_trees, "weights": self.weights, **self.build.to_dict()}
        if self.row_check is not None:  # (decoding padded as the build needs: rows equal to one-token decoding)
            out["batch_invariant"] = self.row_check["equal_rows"] == self.row_check["rows"]
            out["row_check"] = self.row_check
        return out


def _seq_length(ctx: LlamaContext) -> int:
    return int(ctx.lib.llama_memory_seq_pos_max(ctx.memory, 0)) + 1


def _eos_ids(tokenizer: Any, llama: LlamaModel) -> frozenset[int]:
    """End-of-generation ids: the tokenizer's EOS (as the transformers engine reads it) and llama.cpp's own."""
    ids = set(llama.eos_ids())
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return frozenset(ids)


class LlamaCppScorer:
    """One request's verification forwards on llama.cpp (:class:`specframe.contracts.Scorer`).

    Sequence 0 of the context holds the committed tokens but the newest; ``score`` decodes ``[newest] + draft`` at
    the next positions with a logits row per token; ``keep`` removes the cells past the accepted path.
    """

    def __init__(self, target: LlamaCppTarget) -> None:
        self.target = target
        self.ctx = target.take_context()
        self.n_past = 0  # cells of sequence 0 (committed tokens but the newest)
        self.tree: list[int] | None = None  # the parents of the last scored draft when it branched
        self.leaf_of: list[int] = []  # per node of a tree: the sequence id whose path holds it

    def prefill(self, ids: Tensor) -> tuple[None, None]:
        toks = ids[0].tolist()
        for i in range(0, len(toks), N_BATCH):
            chunk = toks[i:i + N_BATCH]
            self.ctx.decode(chunk, list(range(i, i + len(chunk))), logits="last")
        self.n_past = len(toks)
        return None, None

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        self.ctx.set_threads(self.target.threads)
        tokens = [int(newest[0, 0]), *draft.token_ids[0].tolist()]
        if len(tokens) > N_BATCH:
            raise ValueError(f"a draft of {len(tokens) - 1} nodes exceeds llama.cpp's batch of {N_BATCH}")
        self.tree = None
        if draft.num_nodes > 1 and not draft.is_chain():
            if not self.target.supports_trees:
                raise ValueError("this llama.cpp target verifies chains only")
            parent = draft.parent[0].tolist()
            positions, seqs = self._tree_layout(parent)
            self.tree = parent
        else:
            positions, seqs = list(range(self.n_past, self.n_past + len(tokens))), None
        logits = self.ctx.decode(tokens, positions, seqs)
        return Scored(logits.unsqueeze(0), None, None, self.tree)

    def _tree_layout(self, parent: list[int]) -> tuple[list[int], list[tuple[int, ...]]]:
        """Positions and sequence ids of ``[newest] + tree``: one sequence per leaf (sharing the committed cells),
        each node in the sequences of the leaves below it.

        Raises:
            ValueError: more leaves than the context's sequences.
        """
        n = len(parent)
        children = [0] * n
        for p in parent:
            if p >= 0:
                children[p] += 1
        leaves = [i for i in range(n) if children[i] == 0]
        if len(leaves) > MAX_TREE_SEQS:
            raise ValueError(f"a tree of {len(leaves)} leaves exceeds llama.cpp's {MAX_TREE_SEQS} sequences")
        depth = [0] * n
        for i, p in enumerate(parent):
            depth[i] = 1 if p < 0 else depth[p] + 1
        member: list[set[int]] = [set() for _ in range(n)]
        self.leaf_of = [0] * n
        for s, leaf in enumerate(leaves):
            node = leaf
            while node >= 0:
                member[node].add(s)
                node = parent[node]
        for i in range(n):
            self.leaf_of[i] = min(member[i])
        for s in range(1, len(leaves)):
            self.ctx.copy_seq(0, s)  # every leaf's sequence sees the committed cells
        positions = [self.n_past] + [self.n_past + d for d in depth]
        seqs = [tuple(range(len(leaves)))] + [tuple(sorted(m)) for m in member]
        return positions, seqs

    def keep(self, accepted: list[int]) -> None:
        base = self.n_past  # the newest token's position
        if self.tree is not None:
            seq = self.leaf_of[accepted[-1]] if accepted else 0
            self.ctx.keep_seq(seq)  # the accepted path's sequence; every other branch's cells go
            if seq != 0:
                self.ctx.copy_seq(seq, 0)
                self.ctx.remove(seq, -1, -1)
            self.tree = None
        self.ctx.remove(0, base + 1 + len(accepted))
        self.n_past = base + 1 + len(accepted)

    def undo(self) -> None:
        self.ctx.remove(-1, self.n_past)
        self.tree = None

    def close(self) -> None:
        """Give the context back to the target (the engine calls this when the request ends)."""
        if self.ctx is not None:
            self.target.give_context(self.ctx)
            self.ctx = None
