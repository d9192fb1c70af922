"""Several requests in one transformers forward: a batched KV cache with ragged rows, and the per-row scorers the
decode loop drives (:mod:`specframe.decode.batch`).

Layout. One ``DynamicCache`` holds ``B`` rows of ``W`` columns. Row ``r``'s committed tokens (all but its newest, the
engine's KV invariant) sit in the columns ``valid[r]`` marks, in order; the other columns are holes (another row's
longer draft, a rejected node, padding from joining). Each step appends ``n_max`` columns to every row (the longest
``1 + nodes`` of the step; shorter rows are padded), and every row's queries get a ``[n_max, W + n_max]`` mask: its
valid past, then its newest token and draft nodes (causal for a chain, ancestors for a tree). Positions are explicit
(the row's committed length + the node's depth), so a node's key is rotated at the position it will keep, and keeping
the accepted path is marking its columns valid — no copy. When holes reach an eighth of the width (and 16 columns)
the cache is compacted (each row's valid columns gathered to the right): every step's cache update copies every
column, holes included (a ``DynamicCache`` grows by concatenation), so a hole costs on every later step what a valid
column costs, while a compaction costs about one step's copy. (Gathering at half the width let a batch of tree
drafts carry twice the columns it needed: at B = 8 with ngram+medusa, about nine holes per row per drafting step.)

Exactness: a row's logits are computed from the same keys and values at the same positions as the row decoded alone;
masked columns add exact zeros to the softmax. Arithmetic over a different number of key columns and a larger matrix
may round differently in the last bit (see docs/batching.md for what the checks measured).

Only targets whose layers all take one attention mask (full attention: ``Target.supports_trees``) are batched this
way; others decode the batch's requests one forward each (:class:`specframe.decode.batch.SequentialBatch`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from ..contracts import DraftTree
from ..contracts.scoring import Scored
from ..token_tree import node_depths
from .device_sync import clock

__all__ = ["TransformersBatch"]


class _Row:
    """One request's scorer (the :class:`~specframe.contracts.Scorer` protocol) inside a
    :class:`TransformersBatch`: :meth:`score` returns what the batch's last forward computed for the request."""

    def __init__(self, batch: "TransformersBatch", layers: tuple[int, ...], want_hidden: bool) -> None:
        self.batch, self.layers, self.want_hidden = batch, layers, want_hidden
        self.cache: Any = None  # the request's own cache until it joins the batch (after prefill)
        self.length = 0  # committed positions held in the KV (all but the newest token)
        self.results: list[Scored | BaseException] = []  # this step's: [result] or [error, result without draft]
        self.joined = False
        self.closed = False

    # --- the Scorer protocol ------------------------------------------------------------------------------
    def prefill(self, ids: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """``ids [1, T - 1]`` int64: the request's own forward (one row; it joins the batch before its first step)."""
        target = self.batch.target
        self.cache = target.new_cache()
        layers = self.layers
        if layers:
            _, hidden, feats = target.forward_features(ids.to(target.device), self.cache, layers, self.want_hidden,
                                                       logits_to_keep=1)
        else:
            _, hidden = target.forward(ids.to(target.device), self.cache, want_hidden=self.want_hidden,
                                       logits_to_keep=1)
            feats = None
        self.length = int(ids.shape[1])
        return (None if hidden is None else hidden[:, -1]), feats

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        if not self.results:
            raise RuntimeError("a batch row was scored without a batch forward: call TransformersBatch.forward first")
        out = self.results.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    def keep(self, accepted: list[int]) -> None:
        self.batch._keep(self, accepted)

    def undo(self) -> None:
        """The batch restored the cache itself before handing out the error (nothing to forget here)."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.batch._leave(self)


class TransformersBatch:
    """The batch of a transformers :class:`~specframe.target.hf.Target` (``target.new_batch()``).

    Each request gets a row with :meth:`row` (a scorer factory: ``engine.request(..., scorer=batch.row)``); the loop
    drafts every active request, calls :meth:`forward` once with each request's ``(row, newest [1, 1] int64, draft)``,
    then lets each request verify (its row's ``score`` returns its slice) and keep its accepted path.

    Args:
        target: a transformers target with full-attention layers only (``supports_trees``).
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.rows: list[_Row] = []  # joined rows, in cache row order
        self.cache: Any = None  # DynamicCache [B, heads, W, d] per layer, or None while empty
        self.valid = torch.zeros((0, 0), dtype=torch.bool)  # [B, W]: column holds a committed token of the row
        self.last: dict[int, tuple[int, int]] = {}  # id(row) -> (first new column, rows processed) of the last forward
        self.forward_s = 0.0  # seconds of the last forward

    def row(self, target: Any, layers: tuple[int, ...], want_hidden: bool) -> _Row:
        """A scorer factory (:data:`~specframe.contracts.ScorerFactory`) making this batch's rows."""
        return _Row(self, tuple(layers), bool(want_hidden))

    @property
    def width(self) -> int:
        return int(self.valid.shape[1])

    # --- join / leave --------------------------------------------------------------------------------------
    def _join(self, row: _Row) -> None:
        """Append a prefilled row (its own cache; none for a one-token prompt) to the batch."""
        own, n, e, w = row.cache, row.length, len(self.rows), self.width
        if own is None or not n:  # nothing cached yet: a row of holes
            if self.cache is None:
                self.cache = self.target.new_cache()
            if w:
                for layer in self.cache.layers:
                    z = layer.keys.new_zeros((1, *layer.keys.shape[1:]))
                    layer.keys, layer.values = torch.cat([layer.keys, z], 0), torch.cat([layer.values, z.clone()], 0)
            self.valid = torch.cat([self.valid.reshape(e, w), torch.zeros((1, w), dtype=torch.bool)], 0)
        elif not w:  # the batch holds only rows of holes so far: the row's cache, with theirs in front
            for layer in own.layers:
                z = layer.keys.new_zeros((e, *layer.keys.shape[1:]))
                layer.keys, layer.values = torch.cat([z, layer.keys], 0), torch.cat([z.clone(), layer.values], 0)
            self.cache = own
            self.valid = torch.cat([torch.zeros((e, n), dtype=torch.bool), torch.ones((1, n), dtype=torch.bool)], 0)
        else:
            new_w = max(w, n)
            if new_w > w:
                self._pad_columns(new_w - w)
            for mine, theirs in zip(self.cache.layers, own.layers):
                k, v = _pad_right(theirs.keys, new_w - n), _pad_right(theirs.values, new_w - n)
                mine.keys, mine.values = torch.cat([mine.keys, k], 0), torch.cat([mine.values, v], 0)
            vrow = torch.zeros((1, new_w), dtype=torch.bool)
            vrow[0, :n] = True
            self.valid = torch.cat([self.valid, vrow], 0)
        self.rows.append(row)
        row.cache, row.joined = None, True

    def _pad_columns(self, extra: int) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = _pad_right(layer.keys, extra), _pad_right(layer.values, extra)
        self.valid = torch.cat([self.valid, torch.zeros((self.valid.shape[0], extra), dtype=torch.bool)], 1)

    def _leave(self, row: _Row) -> None:
        if not row.joined:
            row.cache = None
            return
        self.last.pop(id(row), None)
        i = self.rows.index(row)
        keep = [j for j in range(len(self.rows)) if j != i]
        self.rows.pop(i)
        if not self.rows:
            self.cache, self.valid = None, torch.zeros((0, 0), dtype=torch.bool)
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.target.device)
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
        self.valid = self.valid[keep]
        self._maybe_compact()

    # --- the step's forward --------------------------------------------------------------------------------
    def forward(self, items: list[tuple[_Row, Tensor, DraftTree]]) -> None:
        """One target forward over every request's ``newest + draft``; each row's next ``score`` returns its slice.

        ``items`` must hold every joined row (plus rows that join now, after their prefill). When the forward
        raises on the drafts, the cache is restored and the step is run again without drafts: rows that drafted get
        the error first (the engine then verifies that step without a draft), the others the draftless result.
        """
        for row, _, _ in items:
            if not row.joined:
                self._join(row)
        order = {id(r): i for i, r in enumerate(self.rows)}
        if len(items) != len(self.rows) or any(id(r) not in order for r, _, _ in items):
            raise RuntimeError("every row of the batch takes part in each forward")
        items = sorted(items, key=lambda it: order[id(it[0])])
        w = self.width
        t0 = time.perf_counter()
        try:
            results = self._run(items)
        except Exception as exc:
            if not any(d.num_nodes for _, _, d in items):
                raise
            self._crop(w)
            plain = self._run([(r, t, DraftTree.empty()) for r, t, _ in items])
            self.forward_s = clock(self.target.device) - t0
            for (row, _, draft), res in zip(items, plain):
                res = replace(res, seconds=self.forward_s)
                row.results = [exc, res] if draft.num_nodes else [res]
            return
        self.forward_s = clock(self.target.device) - t0  # the kernels have run (device_sync)
        for (row, _, _), res in zip(items, results):
            row.results = [replace(res, seconds=self.forward_s)]

    def _run(self, items: list[tuple[_Row, Tensor, DraftTree]]) -> list[Scored]:
        target, device = self.target, self.target.device
        b, w = len(items), self.width
        sizes = [1 + d.num_nodes for _, _, d in items]
        n = max(sizes)
        # what the host knows, packed for one copy: [B, n, 3 + n] int64 = ids, positions, real query (not
        # padding), then the [n, n] block over the step's own columns (newest token, nodes, padding)
        ids = torch.zeros((b, n), dtype=torch.int64)
        pos = torch.zeros((b, n), dtype=torch.int64)
        real = torch.zeros((b, n), dtype=torch.int64)
        blocks = torch.zeros((b, n, n), dtype=torch.bool)
        parents: list[list[int] | None] = []
        for r, (row, newest, draft) in enumerate(items):
            m = draft.num_nodes
            ids[r, 0] = newest.reshape(-1)[0]
            parent = draft.parent[0].tolist() if m else []
            is_tree = m > 1 and not draft.is_chain()
            parents.append(parent if is_tree else None)
            if m:
                ids[r, 1 : 1 + m] = draft.token_ids[0]
            depth = node_depths(parent) if is_tree else list(range(1, m + 1))
            pos[r, 0] = row.length
            pos[r, 1 : 1 + m] = torch.tensor(depth, dtype=torch.int64) + row.length
            pos[r, 1 + m :] = row.length  # padding queries: any position (their output is dropped)
            real[r, : 1 + m] = 1  # real queries see the row's valid past
            block = blocks[r]
            block[0, 0] = True
            for i in range(m):
                p = parent[i] if is_tree else i - 1
                if p >= 0:
                    block[i + 1, : 1 + m] = block[p + 1, : 1 + m]
                else:
                    block[i + 1, 0] = True
                block[i + 1, i + 1] = True
            for i in range(1 + m, n):
                block[i, i] = True  # a padding query sees itself only (no row of the mask is all masked)
        packed = torch.cat([ids[..., None], pos[..., None], real[..., None], blocks.long()], -1).to(device)
        # the [B, n, W + n] mask is built on the device from that and the valid columns ([B, W] bool, the other copy)
        past = self.valid.to(device)[:, None, :] & packed[..., 2:3].bool()  # [B, n, W]
        allowed = torch.cat([past, packed[..., 3:].bool()], -1)
        dtype = target.dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
        mask = mask[:, None]
        rows = [row for row, _, _ in items]
        layers = sorted({i for row in rows for i in row.layers})
        want_hidden = any(row.want_hidden for row in rows)
        out = target.model(input_ids=packed[..., 0].contiguous(), cache=self.cache, use_cache=True,
                           output_hidden_states=bool(want_hidden or layers), attention_mask=mask,
                           position_ids=packed[..., 1].contiguous())
        self.valid = torch.cat([self.valid, torch.zeros((b, n), dtype=torch.bool)], 1)
        results = []
        for r, (row, _, _) in enumerate(items):
            k = sizes[r]
            self.last[id(row)] = (w, k)
            hidden = out.hidden_states[-1][r : r + 1, :k] if row.want_hidden else None
            feats = torch.stack([out.hidden_states[i][r : r + 1, :k] for i in row.layers], 2) if row.layers else None
            results.append(Scored(out.logits[r : r + 1, :k], hidden, feats, parents[r]))
        return results

    def _crop(self, width: int) -> None:
        """Undo a forward that raised partway: every layer back to ``width`` columns."""
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.shape[-2] > width:
                layer.keys, layer.values = layer.keys[..., :width, :], layer.values[..., :width, :]
        self.valid = self.valid[:, :width]

    def _keep(self, row: _Row, accepted: list[int]) -> None:
        """The row keeps its newest token and its accepted nodes (indices into its draft) of the last forward."""
        start, _ = self.last.pop(id(row))
        r = self.rows.index(row)
        cols = [start, *(start + 1 + a for a in accepted)]
        self.valid[r, cols] = True
        row.length += len(cols)
        if not self.last:  # every row of the step has kept its path
            self._maybe_compact()

    def _maybe_compact(self) -> None:
        """Gather each row's valid columns to the right when the holes every row shares are an eighth of the width
        (and at least 16 columns; see the module docstring)."""
        w = self.width
        longest = int(self.valid.sum(1).max()) if len(self.rows) else 0
        if w - longest < max(16, w // 8):
            return
        idx = torch.zeros((len(self.rows), longest), dtype=torch.long)
        valid = torch.zeros((len(self.rows), longest), dtype=torch.bool)
        for r in range(len(self.rows)):
            cols = self.valid[r].nonzero().flatten()
            idx[r, longest - len(cols) :] = cols
            valid[r, longest - len(cols) :] = True
        idx = idx.to(self.target.device)
        for layer in self.cache.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name)
                g = idx[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, torch.gather(t, 2, g))
        self.valid = valid


def _pad_right(t: Tensor, extra: int) -> Tensor:
    """``t [B, heads, W, d]`` with ``extra`` zero columns appended (the holes of a shorter row)."""
    if extra <= 0:
        return t
    return torch.cat([t, t.new_zeros((*t.shape[:2], extra, t.shape[3]))], 2)
