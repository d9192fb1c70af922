"""The trace format: what ``specframe trace record`` stores and ``specframe replay`` reads.

A trace is a folder (format version :data:`VERSION`)::

    manifest.json          model, dtype, specframe version, max_new_tokens, chat, the recording strategy, the
                           target's vocabulary / EOS ids / context / tree support, the cost curve v(n) (the machine
                           profile's T(n) of the settings the target ran with), one entry per question
                           (question_id, category, prompt and new token counts, finish reason), the feature layers,
                           and each data file's size and SHA-256
    tokens.json.gz         gzip'd JSON: per question {"prompt": [ids], "generated": [ids], "entropy": [[H, M2]]}:
                           (entropy: optional, absent in older traces) the target's entropy H and second
                           log-moment M2 (nats, temperature 1) at each generated token, for the entropy bound
    features.safetensors   (only with feature layers) per question ``i`` and layer ``l`` the tensor ``"i/l"``
                           ``[T_f, H]`` in the target's dtype: transformers ``hidden_states[l]`` at the committed
                           positions ``start .. start + T_f - 1`` (every position the target processed: all but the
                           newest token); ``start`` is 0 for a layer some proposer reads as ``feature_layers``
                           (EAGLE-style drafters read the prompt's positions too) and ``prompt_tokens - 2`` for the
                           last layer read only as ``DecodeState.hidden`` (Medusa-style heads)

Sizes: token ids are ~2-3 bytes per token after gzip; features cost ``H x bytes(dtype)`` per position and layer,
e.g. 576 x 4 = 2.3 KB (fp32) or 1.15 KB (bf16) per generated token for SmolLM2-135M's last hidden state, and three
layers at every prompt and generated position for an EAGLE drafter.

Reading validates everything before use: a missing or unreadable manifest, a format version this specframe does not
read, a data file whose size or checksum differs from the manifest (truncated or altered), or token lists that
disagree with the manifest raise :class:`~specframe.errors.TraceError` naming the file and the fix.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import TraceError
from .schema import check_manifest, check_tokens

FORMAT = "specframe-trace"
VERSION = 1
MANIFEST, TOKENS, FEATURES = "manifest.json", "tokens.json.gz", "features.safetensors"
RECORD_AGAIN = "record the trace again (specframe trace record)"


@dataclass
class TraceQuestion:
    """One recorded request: the prompt ids and the target's greedy continuation, plus its feature rows."""

    question_id: Any
    category: str | None
    prompt: list[int]  # [T0] prompt ids as the target saw them (chat template applied when the trace says so)
    generated: list[int]  # [G] generated ids (an EOS that ended generation included)
    finish_reason: str  # "stop" | "length"
    features: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)  # layer -> (start, [T_f, H])
    entropy: list[list[float]] | None = None  # [G][2]: (H, M2) in nats of the distribution that chose each generated
    # token (traces recorded before entropies: None)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated


@dataclass
class Trace:
    """A loaded trace (see the module docstring); ``manifest`` is manifest.json as a dict."""

    manifest: dict[str, Any]
    questions: list[TraceQuestion]
    path: Path | None = None

    @property
    def model(self) -> str:
        return self.manifest["model"]

    @property
    def dtype(self) -> str:
        return self.manifest["dtype"]

    @property
    def max_new_tokens(self) -> int:
        return int(self.manifest["max_new_tokens"])

    @property
    def feature_layers(self) -> dict[int, str]:
        """Recorded layer -> ``"all"`` (every processed position) or ``"last"`` (from the prompt's last but one)."""
        return {int(k): v for k, v in (self.manifest.get("features") or {}).get("layers", {}).items()}

    def describe(self) -> str:
        m = self.manifest
        return (f"{len(self.questions)} questions of {m['model']} ({m['dtype']}), {m['max_new_tokens']} new tokens, "
                f"recorded with {'+'.join(p['name'] for p in m['recorded_with'])} by specframe {m['specframe']}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_trace(trace: Trace, folder: Path) -> None:
    """Write ``trace`` into the empty folder ``folder`` (the caller swaps it in: :func:`specframe.io.atomic.replace_folder`).

    The manifest's ``files`` and ``bytes_per_token`` are filled in here.
    """
    folder = Path(folder)
    payload = [{"prompt": q.prompt, "generated": q.generated, **({"entropy": q.entropy} if q.entropy is not None else {})}
               for q in trace.questions]
    raw = json.dumps(payload, separators=(",", ":")).encode()
    (folder / TOKENS).write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
    files = [TOKENS]
    tensors = {f"{i}/{layer}": rows.contiguous() for i, q in enumerate(trace.questions)
               for layer, (_, rows) in sorted(q.features.items())}
    if tensors:
        from safetensors.torch import save_file

        save_file(tensors, str(folder / FEATURES), metadata={"format": FORMAT, "version": str(VERSION)})
        files.append(FEATURES)
    m = trace.manifest
    generated = sum(len(q.generated) for q in trace.questions) or 1
    m["files"] = {name: {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)} for name in files}
    m["bytes_per_token"] = {"token_ids": round(m["files"][TOKENS]["bytes"] / generated, 2)}
    if tensors:
        m["bytes_per_token"]["features"] = round(m["files"][FEATURES]["bytes"] / generated, 1)
    (folder / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")


def read_trace(folder: str | Path) -> Trace:
    """Read and validate a trace folder.

    Raises:
        TraceError: no such folder or no manifest, a manifest that is not valid JSON, lacks fields or has one of
            the wrong type (:mod:`specframe.replay.schema`), another format or a newer version, a data file that is missing, truncated or altered (size or SHA-256 differs
            from the manifest), or token lists that disagree with the manifest.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise TraceError(f"{folder} is not a folder: give a trace folder written by `specframe trace record`")
    if not path.is_file():
        raise TraceError(f"{folder} holds no {MANIFEST}: it is not a trace; {RECORD_AGAIN}")
    try:
        m = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path} is not valid JSON ({type(exc).__name__}; truncated?): {RECORD_AGAIN}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise TraceError(f"{path} is not a specframe trace manifest (format {m.get('format') if isinstance(m, dict) else None!r})")
    if m.get("version") != VERSION:
        raise TraceError(f"{path}: trace format version {m.get('version')!r}; this specframe reads version {VERSION}: "
                         f"{RECORD_AGAIN} with this version, or use the specframe that wrote it")
    check_manifest(m, str(path), RECORD_AGAIN)  # every field's type: one TraceError, never an AttributeError later
    for name, meta in m["files"].items():
        _check_file(folder / name, meta)
    try:
        payload = json.loads(gzip.decompress((folder / TOKENS).read_bytes()))
    except (OSError, EOFError, ValueError) as exc:
        raise TraceError(f"{folder / TOKENS} cannot be read ({type(exc).__name__}): {RECORD_AGAIN}") from None
    check_tokens(payload, m["target"]["vocab_size"], str(folder / TOKENS), RECORD_AGAIN)
    entries = m["questions"]
    if len(payload) != len(entries):
        raise TraceError(f"{folder / TOKENS} holds {len(payload) if isinstance(payload, list) else 'no'} requests, the "
                         f"manifest lists {len(entries)}: {RECORD_AGAIN}")
    questions = []
    for e, p in zip(entries, payload):
        if len(p["prompt"]) != e["prompt_tokens"] or len(p["generated"]) != e["new_tokens"]:
            raise TraceError(f"{folder / TOKENS}: question {e['question_id']!r} has {len(p['prompt'])} + "
                             f"{len(p['generated'])} tokens, the manifest says {e['prompt_tokens']} + "
                             f"{e['new_tokens']}: {RECORD_AGAIN}")
        if p.get("entropy") is not None and len(p["entropy"]) != len(p["generated"]):
            raise TraceError(f"{folder / TOKENS}: question {e['question_id']!r} has {len(p['entropy'])} entropy entries "
                             f"for {len(p['generated'])} generated tokens: {RECORD_AGAIN}")
        questions.append(TraceQuestion(e["question_id"], e.get("category"), list(p["prompt"]), list(p["generated"]),
                                       e["finish_reason"], entropy=p.get("entropy")))
    trace = Trace(m, questions, folder)
    if FEATURES in m["files"]:
        _read_features(trace, folder / FEATURES)
    return trace


def _check_file(path: Path, meta: dict[str, Any]) -> None:
    if not path.is_file():
        raise TraceError(f"trace file {path} is missing: {RECORD_AGAIN}")
    size = path.stat().st_size
    if size != meta["bytes"]:
        what = "truncated" if size < meta["bytes"] else "longer than recorded"
        raise TraceError(f"trace file {path} is {what} ({size} of {meta['bytes']} bytes): {RECORD_AGAIN}")
    if _sha256(path) != meta["sha256"]:
        raise TraceError(f"trace file {path} was altered (its SHA-256 differs from the manifest's): {RECORD_AGAIN}")


def _read_features(trace: Trace, path: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as exc:
        raise TraceError(f"{path} cannot be read ({exc}): {RECORD_AGAIN}") from None
    layers = trace.feature_layers
    for i, q in enumerate(trace.questions):
        for layer, kind in layers.items():
            rows = tensors.get(f"{i}/{layer}")
            start = 0 if kind == "all" else max(0, len(q.prompt) - 2)
            positions = max(0, len(q.tokens) - 1 - start)
            if rows is None or rows.ndim != 2 or rows.shape[0] != positions:
                raise TraceError(f"{path}: question {q.question_id!r}, layer {layer}: expected {positions} positions, "
                                 f"found {None if rows is None else tuple(rows.shape)}: {RECORD_AGAIN}")
            q.features[layer] = (start, rows)


def check_trace_matches(trace: Trace, model: str, dtype: str, where: str = "the config") -> None:
    """Refuse a trace recorded with another model or dtype than ``model`` (the target's name: a built-in name, or a
    model folder's or .gguf file's name) / ``dtype`` (``auto`` matches any dtype).

    Raises:
        TraceError: naming both models or dtypes and the fix.
    """
    if trace.model != model:
        raise TraceError(f"the trace at {trace.path} was recorded with model {trace.model!r}, {where} asks for "
                         f"{model!r}: replay it with model: {trace.model}, or record a trace of {model}")
    if dtype != "auto" and trace.dtype != dtype:
        raise TraceError(f"the trace at {trace.path} was recorded in {trace.dtype}, {where} asks for {dtype}: replay "
                         f"it with dtype: {trace.dtype}, or record a trace in {dtype}")


def check_same_target(trace: Trace, target: Any) -> None:
    """After loading: the target's vocabulary, EOS ids and depth are the recorded ones (a model of the same name
    that is another model is refused).

    Raises:
        TraceError: naming what differs.
    """
    t = trace.manifest["target"]
    text = target.model.config.get_text_config()
    mine = {"vocab_size": target.vocab_size, "eos_token_ids": sorted(target.eos_token_ids),
            "num_hidden_layers": int(text.num_hidden_layers), "hidden_size": int(text.hidden_size)}
    differs = [k for k, v in mine.items() if t.get(k) != v]
    if differs:
        raise TraceError(f"the trace at {trace.path} was recorded with another {trace.model} ("
                         + ", ".join(f"{k} {t.get(k)} there, {mine[k]} here" for k in differs)
                         + "): record the trace again with this model")
