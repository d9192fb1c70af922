"""The datastore: a corpus's token ids and their suffix array, on disk, searched by binary search.

Layout of a datastore folder (format ``specframe-datastore``, version 1)::

    DS/
      manifest.json   what it was built from (model, tokenizer fingerprint, vocabulary, sizes, sources, timing)
      tokens.npy      int32 [T_s]: every document's token ids, each followed by SEPARATOR (-1);
                      T_s = num_tokens + num_documents
      suffixes.npy    int32 [T_s] (int64 when T_s >= 2**31): the suffix array, i.e. the start positions of all
                      suffixes of tokens.npy in lexicographic order (token ids compared as signed integers, so
                      the separator sorts first; a suffix that is a prefix of another sorts before it)

Both arrays are standard ``.npy`` files, memory-mapped on load (nothing is read until searched). A folder is
written to a temporary sibling and renamed into place when complete, so a reader sees either the old
datastore or the new one, never a partial one.

Search: the occurrences of a pattern are one contiguous range of the suffix array, found with two binary
searches (O(n log T_s) token comparisons for a pattern of n tokens). The suffix array is built by
libdivsufsort (``pydivsufsort``), a linear-memory, O(T_s log T_s) suffix sorter.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import SpecframeError
from ..io.atomic import replace_folder

FORMAT = "specframe-datastore"
VERSION = 1
MANIFEST = "manifest.json"
TOKENS = "tokens.npy"
SUFFIXES = "suffixes.npy"
SEPARATOR = -1  # ends every document: no match and no continuation crosses it


class DatastoreError(SpecframeError, ValueError):
    """A datastore folder is missing, not a datastore, from another format version, or cannot be written."""


@dataclass(frozen=True, slots=True)
class Retrieval:
    """What :meth:`Datastore.retrieve` found for a context.

    ``continuations[j]`` is what followed the ``j``-th sampled occurrence of the context's last ``suffix_len``
    tokens (1 to ``max_depth`` tokens, never crossing a document's end). ``suffix_len == 0``: nothing matched.
    """

    suffix_len: int  # n, length of the longest context suffix that occurs (with a continuation)
    occurrences: int  # how often that suffix occurs in the datastore
    continuations: list[list[int]] = field(default_factory=list)  # [M][<= max_depth], M <= max_occurrences


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Suffix array of ``tokens``.

    Args:
        tokens: ``[T_s]`` int32 token ids (``SEPARATOR`` allowed).

    Returns:
        ``[T_s]`` int32 (int64 when ``T_s >= 2**31``): start positions sorted by the suffix starting there, token ids
        compared as signed integers.
    """
    from pydivsufsort import divsufsort

    assert tokens.ndim == 1 and tokens.dtype == np.int32, (tokens.shape, tokens.dtype)
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int32)
    # pydivsufsort maps signed ids to order-preserving unsigned big-endian ones and sorts their bytes, keeping
    # the suffixes that start on a token boundary
    sa = divsufsort(tokens)
    dtype = np.int32 if len(tokens) < 2**31 else np.int64
    return np.ascontiguousarray(sa, dtype=dtype)


def is_datastore(path: Path) -> bool:
    """Whether ``path`` is a folder with a datastore manifest (of any version)."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def occupied(output: Path) -> str | None:
    """What is at ``output`` that a new datastore must not silently replace (``"a file"``, ``"a folder that is not
    a datastore"``), or None (nothing, an empty folder or a datastore)."""
    output = Path(output)
    if not (output.exists() or output.is_symlink()) or is_datastore(output) or _is_empty_dir(output):
        return None
    return "a file" if output.is_file() else "a folder that is not a datastore"


def check_output(output: Path, force: bool = False) -> None:
    """Refuse to replace something that is not a datastore (an existing datastore or empty folder is fine).

    Raises:
        DatastoreError: ``output`` exists, is neither a datastore nor an empty folder, and ``force`` is off.
    """
    kind = None if force else occupied(output)
    if kind is not None:
        raise DatastoreError(f"{output} is {kind}: choose another output, or replace it (force=True)")


def _concat(documents: Iterable[Sequence[int]], vocab_size: int) -> tuple[np.ndarray, int, int]:
    parts: list[np.ndarray] = []
    num_docs = 0
    sep = np.array([SEPARATOR], dtype=np.int32)
    for doc in documents:
        arr = np.asarray(doc, dtype=np.int64).reshape(-1)
        if len(arr) == 0:
            continue
        if arr.min() < 0 or arr.max() >= vocab_size:
            raise DatastoreError(
                f"document {num_docs} has token ids outside [0, {vocab_size}): "
                f"min {int(arr.min())}, max {int(arr.max())}"
            )
        parts += [arr.astype(np.int32), sep]
        num_docs += 1
    if not parts:
        raise DatastoreError("no tokens to index: every document is empty")
    tokens = np.concatenate(parts)
    return tokens, int(len(tokens) - num_docs), num_docs


def build_datastore(
    documents: Iterable[Sequence[int]],
    output: Path,
    *,
    vocab_size: int,
    model: str = "",
    tokenizer: dict[str, Any] | None = None,
    sources: Sequence[dict[str, Any]] = (),
    input_bytes: int | None = None,
    force: bool = False,
    extra_build_s: float = 0.0,
) -> "Datastore":
    """Index ``documents`` and write the datastore folder ``output`` (atomically); return it opened.

    Args:
        documents: token-id sequences (``[T_d]`` ints in ``[0, vocab_size)``); empty ones are skipped.
        output: the folder to write. An existing datastore there is replaced.
        vocab_size: V of the tokenizer that produced the ids.
        model: the model whose tokenizer was used (recorded, for people).
        tokenizer: ``{"class": ..., "fingerprint": ...}`` (see :func:`specframe.datastore.sources.fingerprint`);
            a proposer checks the fingerprint against its target's tokenizer. None for bare token ids.
        sources: one dict per input (path or preset, documents, bytes, licence), recorded in the manifest.
        input_bytes: UTF-8 bytes of the text the ids came from (recorded).
        force: replace ``output`` even if it is not a datastore.
        extra_build_s: seconds spent before this call (reading, tokenizing), added to ``build_s``.

    Raises:
        DatastoreError: no tokens, ids out of range, or ``output`` is not a datastore and ``force`` is off.
    """
    output = Path(output)
    check_output(output, force)
    t0 = time.perf_counter()
    tokens, num_tokens, num_docs = _concat(documents, vocab_size)
    sa = suffix_array(tokens)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "tokenizer": tokenizer,
        "vocab_size": int(vocab_size),
        "max_token_id": int(tokens.max()),
        "num_tokens": num_tokens,
        "num_documents": num_docs,
        "tokens": {"file": TOKENS, "dtype": "int32", "length": int(len(tokens)), "separator": SEPARATOR},
        "suffixes": {"file": SUFFIXES, "dtype": str(sa.dtype), "length": int(len(sa))},
        "sources": list(sources),
        "input_bytes": input_bytes,
        "build_s": round(extra_build_s + time.perf_counter() - t0, 3),
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    _write(output, tokens, sa, manifest)
    return Datastore.open(output)


def _write(output: Path, tokens: np.ndarray, sa: np.ndarray, manifest: dict[str, Any]) -> None:
    def fill(tmp: Path) -> None:
        np.save(tmp / TOKENS, tokens, allow_pickle=False)
        np.save(tmp / SUFFIXES, sa, allow_pickle=False)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    replace_folder(output, fill, owned=True)  # (build_datastore refused what is not a datastore unless forced)


class Datastore:
    """An opened datastore (see the module docstring for the format).

    Attributes:
        path: the folder.
        manifest: its ``manifest.json``.
        tokens: ``[T_s]`` int32, memory-mapped; documents separated by ``SEPARATOR``.
        suffixes: ``[T_s]`` int32 or int64, memory-mapped suffix array.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], tokens: np.ndarray, suffixes: np.ndarray) -> None:
        self.path = path
        self.manifest = manifest
        self.tokens = tokens
        self.suffixes = suffixes

    @classmethod
    def open(cls, path: str | Path) -> "Datastore":
        """Open (memory-map) the datastore folder ``path``.

        Raises:
            DatastoreError: missing folder or files, not a datastore, another format version, sizes that do not
                match the manifest.
        """
        path = Path(path).expanduser()
        if not path.is_dir():
            raise DatastoreError(f"datastore {path} does not exist: build one with `specframe datastore build`")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError):
            raise DatastoreError(f"{path} is not a datastore (no readable {MANIFEST})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise DatastoreError(f"{path} is not a datastore ({MANIFEST} is not a {FORMAT} manifest)")
        if manifest.get("version") != VERSION:
            raise DatastoreError(
                f"datastore {path} has format version {manifest.get('version')}; this specframe reads version "
                f"{VERSION}: rebuild it with `specframe datastore build`"
            )
        try:
            length = manifest["tokens"]["length"]
            int(manifest["num_tokens"]), int(manifest["num_documents"]), int(manifest["max_token_id"])
            tokens = np.load(path / TOKENS, mmap_mode="r", allow_pickle=False)
            suffixes = np.load(path / SUFFIXES, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            raise DatastoreError(f"datastore {path} is damaged ({type(exc).__name__}: {exc}): rebuild it") from None
        if tokens.dtype != np.int32 or tokens.shape != (length,) or suffixes.shape != (length,) or \
                suffixes.dtype not in (np.int32, np.int64):
            raise DatastoreError(f"datastore {path} is damaged (arrays differ from {MANIFEST}): rebuild it")
        # plain ndarray views of the mapped buffers: slicing a np.memmap subclass is several times slower
        return cls(path, manifest, tokens.view(np.ndarray), suffixes.view(np.ndarray))

    # --- facts -------------------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return int(self.manifest["num_tokens"])

    @property
    def num_documents(self) -> int:
        return int(self.manifest["num_documents"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def max_token_id(self) -> int:
        return int(self.manifest["max_token_id"])

    @property
    def tokenizer_fingerprint(self) -> str | None:
        return (self.manifest.get("tokenizer") or {}).get("fingerprint")

    def size_bytes(self) -> int:
        """Bytes on disk (all files of the folder)."""
        return sum(p.stat().st_size for p in self.path.iterdir() if p.is_file())

    # --- search ------------------------------------------------------------------------------------------------
    def _bound(self, pattern: list[int], lo: int, hi: int, upper: bool) -> int:
        """First suffix-array index in ``[lo, hi)`` whose suffix's first ``n`` tokens are ``>= pattern``
        (``> pattern`` when ``upper``)."""
        toks, sa, n = self.tokens, self.suffixes, len(pattern)
        while lo < hi:
            mid = (lo + hi) // 2
            p = int(sa[mid])
            head = toks[p : p + n].tolist()  # list comparison: lexicographic, a proper prefix sorts first
            if head < pattern or (upper and head == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """``(lo, hi)``: ``suffixes[lo:hi]`` are exactly the positions where ``pattern`` occurs (``lo == hi``: none).

        Args:
            pattern: ``n >= 1`` token ids.
        """
        pattern = [int(t) for t in pattern]
        lo = self._bound(pattern, 0, len(self.suffixes), upper=False)
        hi = self._bound(pattern, lo, len(self.suffixes), upper=True)
        return lo, hi

    def occurrences(self, pattern: Sequence[int]) -> np.ndarray:
        """Start positions (in ``tokens``) of every occurrence of ``pattern``, in suffix-array order: ``[M]``."""
        lo, hi = self.find_range(pattern)
        return np.asarray(self.suffixes[lo:hi])

    def continuation(self, end: int, max_depth: int) -> list[int]:
        """Up to ``max_depth`` tokens from position ``end``, cut at the end of the document."""
        seg = self.tokens[end : end + max_depth].tolist()
        return seg[: seg.index(SEPARATOR)] if SEPARATOR in seg else seg

    def retrieve(
        self,
        context: Sequence[int],
        *,
        max_suffix: int = 16,
        min_suffix: int = 1,
        max_occurrences: int = 64,
        max_depth: int = 8,
    ) -> Retrieval:
        """The continuations that followed the longest suffix of ``context`` found in the datastore.

        Suffix lengths ``n`` are tried from ``max_suffix`` down to ``min_suffix``; the first ``n`` whose suffix
        occurs with at least one non-empty continuation wins. When it occurs more than ``max_occurrences``
        times, ``max_occurrences`` of its occurrences are taken evenly spaced in suffix-array order; that order
        sorts them by what follows, so each distinct continuation is represented about in proportion to its
        frequency (deterministic, no RNG).

        Args:
            context: ``[T]`` token ids (prompt + committed tokens; only the last ``max_suffix`` are used).
            max_suffix, min_suffix: suffix lengths to try, longest first.
            max_occurrences: most continuations returned.
            max_depth: most tokens per continuation.

        Example (one document ``[1, 2, 3, 1, 2, 4]``): ``retrieve([9, 1, 2], max_suffix=3, min_suffix=1)`` finds
        ``[1, 2]`` twice and returns ``Retrieval(suffix_len=2, occurrences=2, continuations=[[3, 1, 2, 4],
        [4]])`` (``max_depth=8``; ``[4]`` is cut at the document's end).
        """
        ctx = [int(t) for t in context[len(context) - max_suffix:]] if max_suffix < len(context) else \
            [int(t) for t in context]
        for n in range(min(max_suffix, len(ctx)), min_suffix - 1, -1):
            lo, hi = self.find_range(ctx[len(ctx) - n :])
            count = hi - lo
            if count == 0:
                continue
            m = min(count, max_occurrences)
            picks = lo + (np.arange(m, dtype=np.int64) * count) // m
            conts = [c for i in picks.tolist() if (c := self.continuation(int(self.suffixes[i]) + n, max_depth))]
            if conts:
                return Retrieval(n, count, conts)
        return Retrieval(0, 0, [])
