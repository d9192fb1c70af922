"""llama-cpp-python's low-level API, as the llama.cpp engine uses it: the import and version check, the build's
features, and one llama.cpp context over one loaded model (a batch with per-row logits, KV removal by position).

Everything here is a thin layer over ``llama_cpp.llama_cpp`` (the C API of llama.cpp: ``llama_decode``,
``llama_get_logits``, ``llama_memory_seq_rm``); no decoding logic lives here.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
import torch

from ...errors import ConfigError

N_BATCH = 512  # tokens per llama_decode: prefill chunks; a draft is verified in one

MIN_VERSION = (0, 3, 36)  # the low-level API used here (llama_memory_*, flash_attn_type, use_extra_bufts)
INSTALL_HINT = "bash scripts/install_llamacpp.sh (or pip install 'specframe[llamacpp]' with CMAKE_ARGS, docs/llamacpp.md)"

_init_lock = threading.Lock()
_initialised = False


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, initialised once (backend, quiet log).

    Raises:
        ConfigError: llama-cpp-python is missing, fails to load, or is older than :data:`MIN_VERSION`.
    """
    global _initialised
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(f"the llama.cpp engine needs llama-cpp-python >= {'.'.join(map(str, MIN_VERSION))} "
                          f"({_reason(exc)}): run {INSTALL_HINT}") from None
    except OSError as exc:  # the shared library failed to load (wrong CPU, missing libgomp, ...)
        raise ConfigError(f"llama-cpp-python is installed but its library does not load ({_reason(exc)}): "
                          f"reinstall it with {INSTALL_HINT}") from None
    version = tuple(int(p) for p in re.findall(r"\d+", getattr(llama_cpp, "__version__", "0"))[:3])
    if version < MIN_VERSION:
        raise ConfigError(f"the llama.cpp engine needs llama-cpp-python >= {'.'.join(map(str, MIN_VERSION))}, this "
                          f"environment has {llama_cpp.__version__}: run {INSTALL_HINT}")
    with _init_lock:
        if not _initialised:
            logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            _quiet_log(llama_cpp)
            llama_cpp.llama_backend_init()
            _initialised = True
    return llama_cpp


_log_callback: Any = None  # kept referenced: llama.cpp calls it from C
_held = threading.local()  # .lines: llama.cpp's error lines kept (not logged) while a model loads in this thread


def _quiet_log(llama_cpp: Any) -> None:
    """Route llama.cpp's own log (model loading, cache notes) to the ``specframe.llama.cpp`` logger at debug level,
    errors (ggml level 4) at error level, instead of stderr — except while :func:`_holding_errors` keeps them for
    the error specframe raises."""
    global _log_callback
    out = logging.getLogger("specframe.llama.cpp")

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: Any) -> None:
        line = text.decode("utf-8", "replace").rstrip()
        held = getattr(_held, "lines", None)
        if level == 4 and held is not None:
            held.append(line)
            return
        out.log(logging.ERROR if level == 4 else logging.DEBUG, "%s", line)

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


@contextmanager
def holding_errors() -> Iterator[list[str]]:
    """Keep llama.cpp's error lines in a list (not logged) while the block runs in this thread: its reason goes into
    the one error line specframe raises, not to stderr before it."""
    _held.lines = []
    try:
        yield _held.lines
    finally:
        _held.lines = None


def _reason(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _pad_outputs(flags: list[bool], padding: "RowPadding") -> None:
    """Flag more rows for logits (from the end, in place) until the output rows are a padded count too: llama.cpp
    computes the last layer's tail and the LM head over the output rows only, so their number picks that product's
    kernel as the batch size picks the others'. (The extra logits are computed and dropped.)"""
    out = sum(flags)
    need = padding.rows(out) - out if out else 0
    for i in range(len(flags) - 1, -1, -1):
        if need <= 0:
            break
        if not flags[i]:
            flags[i], need = True, need - 1


class RowPadding(NamedTuple):
    """Rows a ``llama_decode`` is padded to: at least ``least``, a multiple of ``multiple``."""

    least: int
    multiple: int

    def rows(self, n: int) -> int:
        """The padded row count for ``n`` tokens."""
        n = max(n, self.least)
        return -(-n // self.multiple) * self.multiple


@dataclass(frozen=True)
class BuildInfo:
    """What the installed llama.cpp was built with, from ``llama_print_system_info()``.

    ``llamafile``: the tinyBLAS sgemm, used for batches of 2+ rows (F16/Q8_0 products): row results depend on
    the batch size. ``repack``: repacked (interleaved) Q4_0/IQ4_NL/Q8_0 weight layouts chosen per batch shape.
    """

    version: str
    system_info: str
    llamafile: bool
    repack: bool
    features: tuple[str, ...]  # CPU features compiled in, e.g. ("AVX", "AVX2", "FMA", "F16C")

    @property
    def batch_invariant(self) -> bool:
        """Neither batch-size-dependent kernel family is compiled in (see the class docstring): decoding needs no
        padding to be exact."""
        return not self.llamafile and not self.repack

    @property
    def row_padding(self) -> RowPadding:
        """How many rows every ``llama_decode`` must carry so that each call takes the same kernel: tinyBLAS runs
        only for 2+ rows (ggml's ``llamafile_sgemm`` declines one), the repacked GEMM runs over groups of 4 rows and
        leaves the rest to its GEMV. (1, 1) on a batch-invariant build."""
        if self.repack:
            return RowPadding(4, 4)
        return RowPadding(2, 1) if self.llamafile else RowPadding(1, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"llama_cpp_python": self.version, "llamafile": self.llamafile, "repack": self.repack,
                "features": list(self.features), "batch_invariant": self.batch_invariant,
                "row_padding": list(self.row_padding)}


def build_info() -> BuildInfo:
    """The installed llama.cpp build's features (:class:`BuildInfo`).

    Raises:
        ConfigError: as :func:`import_llama_cpp`.
    """
    llama_cpp = import_llama_cpp()
    text = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    on = {k.strip().upper() for k, v in re.findall(r"([A-Za-z0-9_ ]+?)\s*=\s*(\d+)", text) if v != "0"}
    features = tuple(sorted(k for k in on if k not in ("LLAMAFILE", "REPACK", "OPENMP")))
    return BuildInfo(llama_cpp.__version__, text.strip(), "LLAMAFILE" in on, "REPACK" in on, features)


class _Native:
    """Owns a llama.cpp object: ``close()`` frees it, and so does garbage collection."""

    def close(self) -> None:  # pragma: no cover - overridden
        pass

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class LlamaModel(_Native):
    """One GGUF loaded by llama.cpp (weights memory-mapped, CPU only).

    Args:
        path: the ``.gguf`` file.
        extra_buffers: let llama.cpp choose extra weight buffer types (repacked layouts, AMX); off by default,
            since their results depend on the batch size.

    Raises:
        ConfigError: the file does not exist or llama.cpp cannot load it.
    """

    def __init__(self, path: Path, extra_buffers: bool = False) -> None:
        self.lib = import_llama_cpp()
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"model file {self.path} does not exist: give the path of a .gguf file")
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = bool(extra_buffers)
        with holding_errors() as held:
            ptr = self.lib.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        if not ptr:
            why = next((line.split("error loading model:", 1)[-1].strip() for line in reversed(held)
                        if "error loading model" in line), held[-1].strip() if held else "")
            raise ConfigError(f"llama.cpp cannot load {self.path} ({why or 'not a GGUF file of a model it supports'}; "
                              "not a GGUF of a model it supports, or damaged): give a GGUF that llama.cpp loads")
        for line in held:  # (a load that worked despite them: logged as before)
            logging.getLogger("specframe.llama.cpp").error("%s", line)
        self.ptr = ptr
        self.contexts: weakref.WeakSet = weakref.WeakSet()  # open contexts made from this model
        self.vocab = self.lib.llama_model_get_vocab(ptr)
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(self.lib.llama_model_n_ctx_train(ptr))
        self.n_embd = int(self.lib.llama_model_n_embd(ptr))
        self.description = self._desc()

    def _desc(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.llama_model_desc(self.ptr, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def eos_ids(self) -> frozenset[int]:
        """End-of-generation tokens as llama.cpp sees them (EOS, EOT)."""
        ids = {int(self.lib.llama_vocab_eos(self.vocab)), int(self.lib.llama_vocab_eot(self.vocab))}
        return frozenset(i for i in ids if 0 <= i < self.n_vocab)

    def close(self) -> None:
        """Free the model, unless a context made from it is still open (then it is freed when collected)."""
        if getattr(self, "ptr", None) and not self.contexts:
            self.lib.llama_model_free(self.ptr)
            self.ptr = None


class LlamaContext(_Native):
    """One llama.cpp context: a KV cache of ``n_ctx`` cells and the batch that fills it.

    Positions are those of sequence 0 (``n_seq_max`` sequences for token trees). Logits come back as float32
    ``[rows, V]`` tensors (a copy: the next decode overwrites llama.cpp's buffer).

    Args:
        model: the loaded model (kept alive by the context).
        n_ctx: KV cells.
        n_batch: the most tokens one :meth:`decode` takes (prefills are split into chunks of this size).
        threads: CPU threads for one-token and batch decoding.
        n_seq_max: sequence ids a token may carry (token trees).
        flash_attention: llama.cpp's fused attention (off: its split-KV path depends on the batch shape).
        unified: one KV cache for every sequence (token trees share the committed cells); False: a stream of
            ``n_ctx / n_seq_max`` cells per sequence (batched requests: each attends to its own cells only).
        padding: rows every decode carries (:attr:`BuildInfo.row_padding`): fewer tokens are followed by copies of
            the last one at the next positions of its sequences, without logits, whose cells are removed again
            before :meth:`decode` returns; each stream gets room for them.

    Raises:
        ConfigError: llama.cpp cannot create the context (e.g. no memory for ``n_ctx`` cells).
    """

    def __init__(self, model: LlamaModel, n_ctx: int, n_batch: int, threads: int, n_seq_max: int = 1,
                 flash_attention: bool = False, unified: bool = True, padding: RowPadding = RowPadding(1, 1)) -> None:
        self.model, self.lib = model, model.lib
        self.padding = padding
        slack = padding.rows(1) - 1 + padding.multiple - 1  # cells the padding may occupy (per stream)
        params = self.lib.llama_context_default_params()
        params.n_ctx = n_ctx + slack * (1 if unified else n_seq_max)
        params.n_batch = params.n_ubatch = n_batch + slack  # (a padded decode stays one ubatch)
        params.n_seq_max = n_seq_max
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = (self.lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attention
                                  else self.lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.no_perf = True
        params.embeddings = False
        params.kv_unified = unified  # False: one KV stream per sequence (n_ctx / n_seq_max cells each)
        params.swa_full = True  # sliding-window layers keep every cell: a rollback may need cells past the window
        ptr = self.lib.llama_init_from_model(model.ptr, params)
        if not ptr:
            raise ConfigError(f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name}: "
                              "use a smaller llamacpp n_ctx")
        self.ptr = ptr
        model.contexts.add(self)
        self.memory = self.lib.llama_get_memory(ptr)
        self.n_ctx, self.n_batch, self.n_seq_max, self.threads = n_ctx, n_batch, n_seq_max, threads
        self.batch = self.lib.llama_batch_init(n_batch + slack, 0, n_seq_max)
        self.n_vocab = model.n_vocab

    def set_threads(self, threads: int) -> None:
        if threads != self.threads:
            self.lib.llama_set_n_threads(self.ptr, threads, threads)
            self.threads = threads

    def clear(self) -> None:
        """Empty the KV cache."""
        self.lib.llama_memory_clear(self.memory, True)

    def remove(self, seq: int, start: int, end: int = -1) -> None:
        """Drop sequence ``seq``'s cells at positions ``[start, end)`` (``end`` -1: to the end; ``seq`` -1: any)."""
        self.lib.llama_memory_seq_rm(self.memory, seq, start, end)

    def copy_seq(self, src: int, dst: int, start: int = -1, end: int = -1) -> None:
        """Let sequence ``dst`` share ``src``'s cells at positions ``[start, end)`` (no data is copied)."""
        self.lib.llama_memory_seq_cp(self.memory, src, dst, start, end)

    def keep_seq(self, seq: int) -> None:
        """Drop every cell that sequence ``seq`` does not hold."""
        self.lib.llama_memory_seq_keep(self.memory, seq)

    def decode(self, tokens: list[int], positions: list[int], seqs: list[tuple[int, ...]] | None = None,
               logits: str = "all") -> torch.Tensor | None:
        """One ``llama_decode`` over ``len(tokens) <= n_batch`` tokens.

        Args:
            tokens: token ids.
            positions: each token's position.
            seqs: the sequence ids of each token (None: all in sequence 0).
            logits: ``"all"`` (a row per token), ``"last"`` (one row) or ``"none"``.

        Returns:
            ``[len(tokens) or 1, V]`` float32 logits, or None for ``"none"``.

        Raises:
            RuntimeError: llama.cpp refused the batch (no free KV cell: the context is full) or failed.
        """
        n = len(tokens)
        want = [logits == "all" or (logits == "last" and i == n - 1) for i in range(n)]
        rows = self.padding.rows(n) if n else 0
        flags = want + [logits != "none"] * (rows - n)  # padding rows give logits too, when any are wanted
        _pad_outputs(flags, self.padding)
        b = self.batch
        b.n_tokens = rows
        pad_ids = (0,) if seqs is None else seqs[-1]
        pad_from = max(positions) + 1 if rows > n else 0
        for i in range(rows):
            real = i < n
            b.token[i] = tokens[i] if real else tokens[-1]
            b.pos[i] = positions[i] if real else pad_from + i - n
            ids = ((0,) if seqs is None else seqs[i]) if real else pad_ids
            b.n_seq_id[i] = len(ids)
            for j, s in enumerate(ids):
                b.seq_id[i][j] = s
            b.logits[i] = flags[i]
        rc = int(self.lib.llama_decode(self.ptr, b))
        if rows > n:
            for s in pad_ids:
                self.lib.llama_memory_seq_rm(self.memory, s, pad_from, -1)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for {n} tokens"
                               + (" (no free KV cell: the context is full)" if rc == 1 else ""))
        if logits == "none":
            return None
        ptr = self.lib.llama_get_logits(self.ptr)
        n_out = sum(flags)
        out = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        if n_out != sum(want):  # keep the rows asked for (outputs come in batch order)
            order = [j for j, f in enumerate(flags) if f]
            out = out[[order.index(i) for i in range(n) if want[i]]]
        return torch.from_numpy(out.copy())

    def close(self) -> None:
        if getattr(self, "ptr", None):
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(self.ptr)
            self.ptr = None
            self.model.contexts.discard(self)
