"""Loading a llama.cpp target: the GGUF (no de-quantisation), its tokenizer, the build check and the thread count
this machine's llama.cpp profile chooses."""

from __future__ import annotations

import logging
from typing import Any, Callable

from ...errors import ConfigError
from ..cost import CostCurve

log = logging.getLogger("specframe")


def check_request(dtype: str, device: str, prepack: bool | str) -> None:
    """Refuse settings that belong to the transformers engine.

    Raises:
        ConfigError: a device other than cpu, a dtype other than auto, or prepack on.
    """
    if device != "cpu":
        raise ConfigError(f"engine llama.cpp runs on the CPU here, got device {device}: use device cpu or engine "
                          "transformers")
    if dtype != "auto":
        raise ConfigError(f"engine llama.cpp runs the GGUF's own tensor types, got dtype {dtype}: use dtype auto (or "
                          "engine transformers for a float32 / bfloat16 target)")
    if prepack is True:
        raise ConfigError("prepack applies to the transformers engine (oneDNN weights): use prepack auto or off "
                          "with engine llama.cpp")


def _tokenizer(gguf: Any, log_line: Callable[[str], None]) -> Any:
    """The transformers tokenizer of ``gguf`` (cached once per GGUF content).

    Raises:
        ConfigError: transformers cannot read a tokenizer from the GGUF.
    """
    from transformers import AutoTokenizer

    from ..models import tokenizer_directory

    try:
        return AutoTokenizer.from_pretrained(tokenizer_directory(gguf, log_line))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot read the tokenizer of {gguf} ({first}): specframe encodes prompts with the "
                          "GGUF's tokenizer through transformers, which needs the gguf package and a tokenizer it "
                          "supports") from None


def _check_rows(target: Any, model_name: str, inexact: bool) -> None:
    """Refuse (unless ``inexact``) a model whose k-token batches round differently from one-token decoding on this
    build: some kernels (e.g. of K-quant types) choose their code path by the batch size.

    Raises:
        ConfigError: rows of the check batch differ and ``inexact`` is False.
    """
    from .profile import cached_row_check

    rows = cached_row_check(target, model_name, target.threads)
    target.row_check = rows
    if rows["equal_rows"] == rows["rows"] or inexact:
        return
    raise ConfigError(
        f"on this llama.cpp build, {target.llama.description} rounds a {rows['rows']}-token batch differently from "
        f"one-token decoding (row {rows['first_differing_row']} on differs, by up to {rows['max_abs_diff']:.3g} in "
        "logits), so speculative output would not be exactly llama.cpp's: set llamacpp option inexact: true to "
        "accept divergences, or use engine transformers")


def _exact_build(inexact: bool) -> Any:
    """This llama-cpp-python build's facts; refuses a build whose k-token batches round differently from one-token
    decoding unless ``inexact``.

    Raises:
        ConfigError: a build with LLAMAFILE or REPACK kernels, without ``inexact``."""
    from .binding import EXACT_CMAKE_ARGS, build_info

    build = build_info()
    if not build.batch_invariant and not inexact:
        raise ConfigError(
            f"this llama-cpp-python build uses {' and '.join(k for k, on in (('LLAMAFILE', build.llamafile), ('REPACK', build.repack)) if on)} "
            "kernels, whose k-token batches round differently from one-token decoding (not exact): rebuild it with "
            f"bash scripts/install_llamacpp.sh (CMAKE_ARGS=\"{EXACT_CMAKE_ARGS}\"), or set llamacpp option "
            "inexact: true to accept divergences")
    return build


def load_llamacpp_target(name_or_path: str, dtype: str = "auto", device: str = "cpu",
                         log_line: Callable[[str], None] = lambda s: None, threads: int | str = "auto",
                         prepack: bool | str = "auto", speculative: bool = True, progress: Any = None,
                         measure: bool | None = None, options: dict[str, Any] | None = None):
    """Resolve a GGUF and load it on llama.cpp. Returns a :class:`~specframe.target.llamacpp.target.LlamaCppTarget`.

    ``threads: auto`` is chosen from this machine's llama.cpp profile (:mod:`specframe.target.llamacpp.profile`, measured once
    per build, with a bar on ``progress``) within the cores other processes leave free; the live cost curve is
    ``target.info.cost``. ``options``: ``n_ctx`` (KV cells), ``trees`` (verify token trees: not bit-exact),
    ``inexact`` (run where llama.cpp's k-token batches round differently from one-token decoding: a build with
    llamafile / repack kernels, or a model whose kernels depend on the batch size).

    Raises:
        ConfigError: settings of the transformers engine (see :func:`check_request`), a model that is not a GGUF,
            llama-cpp-python missing or too old, a build or model that is not batch-invariant (unless ``inexact``), or
            a file llama.cpp cannot load.
    """
    from ..machine import LoadMonitor, choose_threads, usable_cores
    from ..models import resolve_model
    from ..profile import Candidate, Settings, ThreadGovernor, load_independent, measured_threads
    from .profile import DTYPE, get_profile
    from .target import LlamaCppTarget

    opts = dict(options or {})
    check_request(dtype, device, prepack)
    source = resolve_model(name_or_path)
    if source.gguf is None:
        raise ConfigError(f"engine llama.cpp runs .gguf files, and {name_or_path} is not one: give a .gguf file (or "
                          "a folder with one), or use engine transformers")
    build = _exact_build(bool(opts.get("inexact")))
    from .binding import LlamaModel

    llama = LlamaModel(source.gguf)  # a file llama.cpp cannot load fails here, in one line
    tokenizer = _tokenizer(source.gguf, log_line)
    cores, cores_why = usable_cores()
    others = LoadMonitor().sample(settle_s=0.2).others
    fit = choose_threads(cores, others)
    target = LlamaCppTarget(source.gguf, tokenizer, name=source.name, threads=fit, n_ctx=opts.get("n_ctx"),
                            trees=bool(opts.get("trees")), build=build, llama=llama)
    profile = get_profile(target, source.name, progress) if (measure or (measure is None and threads == "auto")) \
        else None
    if profile is not None:
        cand, _, reason = profile.choose("auto", threads, False, fit, speculative)
    else:
        cand, reason = Candidate(DTYPE, int(threads) if threads != "auto" else fit, False), "as given"
    settings = Settings(DTYPE, cand.threads, False, f"the GGUF's own tensor types ({target.llama.description})",
                        "as given" if threads != "auto" else f"{cores_why}; others using {others:.1f}; {reason}",
                        "not used by llama.cpp", str(profile.path) if profile is not None and profile.path else None)
    target.set_threads(settings.threads)
    _check_rows(target, source.name, bool(opts.get("inexact")))
    measured = profile.find(cand) if profile is not None else None
    curve = CostCurve(measured.t_ms if measured else None, load_independent(profile, cand))
    governor = ThreadGovernor(settings, threads == "auto", cores, profile, curve, apply=target.set_threads)
    if profile is not None and not measured_threads(profile, cand):
        governor.auto = False
    target.attach_machine(settings, governor)
    return target
