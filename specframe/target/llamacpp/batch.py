"""Several requests in one ``llama_decode``: one context whose KV cache has a stream per sequence (``kv_unified``
off), a sequence id per request, and the per-row scorers the decode loop drives (:mod:`specframe.decode.batch`).

Why per-sequence streams: in a unified cache the rows of several requests interleave, and each query's softmax and
weighted sum run over every cell (others' masked to zero) — other SIMD lanes, other rounding: measured 0.4-0.6 logit
differences against one-token decoding on the default model. With a stream per sequence a request attends to its own
cells only, laid out as when it decodes alone, and on the batch-invariant build (no llamafile sgemm, no repacked
weights: docs/llamacpp.md) every row of a batch rounds as one-token decoding: logits bit-identical
(``tests/target/test_llamacpp.py``).

Ragged rows: llama.cpp splits a batch whose sequences carry different token counts into several micro-batches (one
graph each), so a step pads every row to the longest with copies of its last token at the next positions. Causal
attention keeps a row's real tokens blind to its padding, whose cells are removed with the rejected nodes.

Chains only: token trees use sequence ids of their own (``trees`` engine option): such a target decodes batches one
request per forward (:class:`specframe.decode.batch.SequentialBatch`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...contracts import DraftTree
from ...contracts.scoring import Scored
from ...errors import ConfigError
from .binding import N_BATCH, LlamaContext

__all__ = ["LlamaCppBatch"]


class _Row:
    """One request's scorer (:class:`~specframe.contracts.Scorer`) in a :class:`LlamaCppBatch`: sequence
    ``seq`` of the batch's context; :meth:`score` returns what the batch's last decode computed for it."""

    def __init__(self, batch: "LlamaCppBatch", seq: int) -> None:
        self.batch, self.seq = batch, seq
        self.n_past = 0  # cells of its sequence (committed tokens but the newest)
        self.results: list[Scored | BaseException] = []
        self.closed = False

    def prefill(self, ids: Tensor) -> tuple[None, None]:
        toks, ctx, n = ids[0].tolist(), self.batch.ctx, self.batch.ctx.n_batch
        ctx.set_threads(self.batch.target.threads)
        for i in range(0, len(toks), n):
            chunk = toks[i : i + n]
            ctx.decode(chunk, list(range(i, i + len(chunk))), seqs=[(self.seq,)] * len(chunk), logits="last")
        self.n_past = len(toks)
        return None, None

    def score(self, newest: Tensor, draft: DraftTree) -> Scored:
        if not self.results:
            raise RuntimeError("a batch row was scored without a batch forward: call LlamaCppBatch.forward first")
        out = self.results.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    def keep(self, accepted: list[int]) -> None:
        self.n_past += 1 + len(accepted)
        self.batch.ctx.remove(self.seq, self.n_past)  # rejected nodes and padding

    def undo(self) -> None:
        """The batch removed what the failed decode left before handing out the error."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.batch._leave(self)


class LlamaCppBatch:
    """The batch of a :class:`~specframe.target.llamacpp.target.LlamaCppTarget` (``target.new_batch(rows)``).

    Args:
        target: the llama.cpp target (chains only: ``supports_trees`` False).
        rows: the most requests at once (the context's sequences); each gets ``target.n_ctx`` KV cells.

    Raises:
        ConfigError: llama.cpp cannot allocate ``rows * n_ctx`` cells (the message says what to lower).
    """

    def __init__(self, target: Any, rows: int) -> None:
        self.target, self.rows = target, int(rows)
        try:
            self.ctx = LlamaContext(target.llama, target.n_ctx * self.rows, max(N_BATCH, 8 * self.rows), target.threads,
                                    self.rows, unified=False, padding=target.build.row_padding)
        except ConfigError:
            raise ConfigError(f"llama.cpp could not hold {self.rows} requests of {target.n_ctx} tokens at once: use a "
                              "smaller --batch-size or llamacpp n_ctx") from None
        self.free = list(range(self.rows))[::-1]  # sequence ids not in use
        self.forward_s = 0.0

    def row(self, target: Any, layers: tuple[int, ...], want_hidden: bool) -> _Row:
        """A scorer factory (:data:`~specframe.contracts.ScorerFactory`).

        Raises:
            ConfigError: hidden states or features were asked for (llama.cpp gives none here).
            RuntimeError: more rows than the batch was made for.
        """
        if layers or want_hidden:
            raise ConfigError("the llama.cpp engine gives no hidden states: proposers that read them (medusa, "
                              "eagle) need engine transformers")
        if not self.free:
            raise RuntimeError(f"the llama.cpp batch holds {self.rows} requests at most")
        seq = self.free.pop()
        self.ctx.remove(seq, 0)  # (a finished request's cells are gone already; this makes sure)
        return _Row(self, seq)

    def _leave(self, row: _Row) -> None:
        self.ctx.remove(row.seq, 0)
        self.free.append(row.seq)

    def forward(self, items: list[tuple[_Row, Tensor, DraftTree]]) -> None:
        """One ``llama_decode`` over every request's ``newest + draft`` (rows padded to the longest, see the module
        docstring); each row's next ``score`` returns its logits ``[1, 1 + nodes, V]`` float32. A decode that raises
        on the drafts is undone and run again without them (rows that drafted get the error first, as with
        :class:`~specframe.target.batch_kv.TransformersBatch`)."""
        import time

        t0 = time.perf_counter()
        self.ctx.set_threads(self.target.threads)
        try:
            results = self._decode(items)
        except Exception as exc:
            if not any(d.num_nodes for _, _, d in items):
                raise
            for row, _, _ in items:
                self.ctx.remove(row.seq, row.n_past)
            plain = self._decode([(r, t, DraftTree.empty()) for r, t, _ in items])
            self.forward_s = time.perf_counter() - t0
            for (row, _, draft), res in zip(items, plain):
                res = Scored(res.logits, None, None, None, self.forward_s)
                row.results = [exc, res] if draft.num_nodes else [res]
            return
        self.forward_s = time.perf_counter() - t0
        for (row, _, _), res in zip(items, results):
            row.results = [Scored(res.logits, None, None, None, self.forward_s)]

    def _decode(self, items: list[tuple[_Row, Tensor, DraftTree]]) -> list[Scored]:
        for _, _, draft in items:
            if draft.num_nodes > 1 and not draft.is_chain():
                raise ValueError("the llama.cpp batch verifies chains only")
        rows = [[int(newest.reshape(-1)[0]), *draft.token_ids[0].tolist()] for _, newest, draft in items]
        width = max(len(r) for r in rows)
        if width * len(rows) > self.ctx.n_batch:
            raise ValueError(f"{len(rows)} rows of {width} tokens exceed llama.cpp's batch of {self.ctx.n_batch}")
        tokens, positions, seqs = [], [], []
        for (row, _, _), toks in zip(items, rows):
            padded = toks + [toks[-1]] * (width - len(toks))
            tokens += padded
            positions += list(range(row.n_past, row.n_past + width))
            seqs += [(row.seq,)] * width
        logits = self.ctx.decode(tokens, positions, seqs)
        out = []
        for i, toks in enumerate(rows):
            out.append(Scored(logits[i * width : i * width + len(toks)].unsqueeze(0), None, None, None))
        return out

    def close(self) -> None:
        self.ctx.close()
