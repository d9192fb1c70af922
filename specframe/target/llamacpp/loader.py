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
        f"on this llama.cpp build, {target.llama.description} rounds k-token batches differently from one-token "
        f"decoding ({rows['rows'] - rows['equal_rows']} of {rows['rows']} rows of batches of "
        f"{', '.join(map(str, rows.get('sizes', [])))} differ, by up to {rows['max_abs_diff']:.3g} in logits), so "
        "speculative output would not be exactly llama.cpp's: set llamacpp option inexact: true to accept "
        "divergences, use another llamacpp weights type, or use engine transformers")


AUTO_WEIGHTS = ("gguf", "bf16", "q8_0")  # what weights: auto chooses among (near-lossless for the shipped files)


def _weights_file(source: Any, weights: str, log_line: Callable[[str], None]) -> Any:
    """The GGUF llama.cpp runs for ``weights`` (the source itself for ``gguf``)."""
    if weights == "gguf":
        return source.gguf
    from .weights import requantized

    return requantized(source.gguf, weights, log_line)


def _choose_weights(source: Any, build: Any, fit: int, threads: int | str, speculative: bool, progress: Any,
                    log_line: Callable[[str], None]) -> tuple[str, str]:
    """``weights: auto``: the candidate of :data:`AUTO_WEIGHTS` with the lowest measured cost per token here
    (:meth:`specframe.target.profile.Measured.cost` of each one's profile), by the profile's within-noise rule: the
    first of :data:`AUTO_WEIGHTS` (for speculation plain decoding's choice first) that the fastest does not beat
    outside noise (:func:`specframe.target.profile.faster`, unpaired: each type has a profile of its own); and
    speculation runs on other weights than plain decoding's only where they beat plain decoding's best T(1) and its
    speculative cost outside noise. Returns ``(weights, reason)``."""
    from ..profile import faster
    from .binding import LlamaModel
    from .profile import get_profile
    from .target import LlamaCppTarget

    spec: dict[str, Any] = {}
    plain: dict[str, Any] = {}
    for kind in AUTO_WEIGHTS:
        path = _weights_file(source, kind, log_line)
        probe = LlamaCppTarget(path, None, name=source.name, threads=fit, build=build, llama=LlamaModel(path))
        probe.weights = kind
        try:
            profile = get_profile(probe, _profile_name(source.name, kind), progress)
            _, measured, _ = profile.choose("auto", threads, False, fit, speculative)
            _, measured_plain, _ = profile.choose("auto", threads, False, fit, False)
        finally:
            probe.llama.close()
        if measured is not None and measured_plain is not None:
            spec[kind], plain[kind] = measured, measured_plain
    if not spec:
        return "gguf", "nothing measured: the file's own types"

    def pick(ms: dict[str, Any], speculative: bool, first: str | None = None) -> tuple[str, str]:
        order = sorted(ms, key=lambda k: (k != first, AUTO_WEIGHTS.index(k)))
        fastest = min(order, key=lambda k: ms[k].cost(speculative))
        tied = [k for k in order if k == fastest or not faster(ms[fastest], ms[k], speculative, paired=False)]
        listed = ", ".join(f"{k} {ms[k].cost(speculative):.1f}" for k in sorted(ms, key=lambda k: ms[k].cost(speculative)))
        why = f"fastest measured (ms per token: {listed})"
        if tied[0] != fastest:
            why = f"{tied[0]}: within noise of the fastest measured, {fastest} (ms per token: {listed})"
        return tied[0], why

    best_plain, why_plain = pick(plain, False)
    if not speculative:
        return best_plain, why_plain
    best, why = pick(spec, True, best_plain)
    if best != best_plain and not (faster(spec[best], plain[best_plain], True, False, paired=False)
                                   and faster(spec[best], spec[best_plain], True, True, paired=False)):
        return best_plain, (f"plain decoding's weights, {best_plain}: {best} ({spec[best].cost(True):.1f} ms per "
                            f"token at the reference acceptance) does not beat them outside noise")
    return best, why


def _profile_name(name: str, weights: str) -> str:
    """The name a model's profile and row check are kept under (one per weight type)."""
    return name if weights == "gguf" else f"{name}-{weights}"


def load_llamacpp_target(name_or_path: str, dtype: str = "auto", device: str = "cpu",
                         log_line: Callable[[str], None] = lambda s: None, threads: int | str = "auto",
                         prepack: bool | str = "auto", speculative: bool = True, progress: Any = None,
                         measure: bool | None = None, options: dict[str, Any] | None = None):
    """Resolve a GGUF and load it on llama.cpp. Returns a :class:`~specframe.target.llamacpp.target.LlamaCppTarget`.

    ``threads: auto`` is chosen from this machine's llama.cpp profile (:mod:`specframe.target.llamacpp.profile`, measured once
    per build, with a bar on ``progress``) within the cores other processes leave free; the live cost curve is
    ``target.info.cost``. ``options``: ``n_ctx`` (KV cells), ``trees`` (verify token trees: not bit-exact),
    ``weights`` (the tensor types run: ``gguf``, a requantization, or ``auto``), ``inexact`` (run where llama.cpp's
    k-token batches round differently from one-token decoding even padded: a model whose kernels depend on the batch
    size).

    Raises:
        ConfigError: settings of the transformers engine (see :func:`check_request`), a model that is not a GGUF,
            llama-cpp-python missing or too old, a model whose rows differ by batch size on this build (unless
            ``inexact``), a file llama.cpp cannot load or requantize.
    """
    from ..machine import LoadMonitor, choose_threads, usable_cores
    from ..models import resolve_model
    from .profile import get_profile
    from .target import LlamaCppTarget

    opts = dict(options or {})
    check_request(dtype, device, prepack)
    source = resolve_model(name_or_path)
    if source.gguf is None:
        raise ConfigError(f"engine llama.cpp runs .gguf files, and {name_or_path} is not one: give a .gguf file (or "
                          "a folder with one), or use engine transformers")
    from .binding import LlamaModel, build_info

    # any build runs: one with llamafile / repack kernels decodes padded (BuildInfo.row_padding), and the load-time
    # row check proves the result (_check_rows)
    build = build_info()
    weights = opts.get("weights") or "gguf"
    llama = LlamaModel(source.gguf)  # a file llama.cpp cannot load fails here, in one line
    tokenizer = _tokenizer(source.gguf, log_line)
    cores, cores_why = usable_cores()
    others = LoadMonitor().sample(settle_s=0.2).others
    fit = choose_threads(cores, others)
    measuring = bool(measure or (measure is None and threads == "auto"))
    weights_why = "as given"
    if weights == "auto":
        weights, weights_why = _choose_weights(source, build, fit, threads, speculative, progress, log_line) \
            if measuring else ("gguf", "not measured: the file's own types")
    path = _weights_file(source, weights, log_line)
    if path != source.gguf:  # (requantized: run that file instead)
        llama.close()
        llama = LlamaModel(path)
    target = LlamaCppTarget(path, tokenizer, name=source.name, threads=fit, n_ctx=opts.get("n_ctx"),
                            trees=bool(opts.get("trees")), build=build, llama=llama)
    target.weights, target.weights_why = weights, weights_why
    model_name = _profile_name(source.name, weights)
    profile = get_profile(target, model_name, progress) if measuring else None
    settings, cand = _thread_settings(target, source, profile, threads, fit, speculative, cores_why, others)
    target.set_threads(settings.threads)
    _check_rows(target, model_name, bool(opts.get("inexact")))
    _attach_governor(target, settings, cand, profile, threads == "auto", cores)
    return target


def _thread_settings(target: Any, source: Any, profile: Any, threads: int | str, fit: int, speculative: bool,
                     cores_why: str, others: float) -> tuple[Any, Any]:
    """What ``target`` (its ``weights`` and ``weights_why`` set), loaded from ``source`` (the resolved model), runs
    with: ``threads: auto`` is the profile's choice within ``fit`` threads (``fit`` itself when ``profile`` is None:
    not measured), a number is taken as given. Returns ``(Settings, Candidate)`` (:mod:`specframe.target.profile`);
    the reason of an ``auto`` choice starts with the usable cores (``cores_why``) and others' load (cores)."""
    from ..profile import Candidate, Settings

    weights, weights_why = target.weights, target.weights_why
    plain = None
    if profile is not None:
        cand, _, reason = profile.choose("auto", threads, False, fit, speculative)
        plain = profile.plain_reference("auto", threads, False, fit)
    else:
        cand, reason = Candidate(weights, int(threads) if threads != "auto" else fit, False), "as given"
    what = f"the GGUF's own tensor types ({target.llama.description})" if weights == "gguf" else \
        f"{source.gguf.name} requantized to {weights} ({weights_why})"
    settings = Settings(weights, cand.threads, False, what,
                        "as given" if threads != "auto" else f"{cores_why}; others using {others:.1f}; {reason}",
                        "not used by llama.cpp", str(profile.path) if profile is not None and profile.path else None,
                        *(plain or (None, None)))
    return settings, cand


def _attach_governor(target: Any, settings: Any, cand: Any, profile: Any, auto: bool, cores: int) -> None:
    """Give ``target`` its ``settings`` and a thread governor over ``cores`` usable cores: the live cost curve of
    ``cand`` (ms per forward, from ``profile``; none when not measured), retuning the threads only when they were
    chosen (``auto``) and the profile measured ``cand``'s weights at some thread count."""
    from ..profile import ThreadGovernor, load_independent, measured_threads

    measured = profile.find(cand) if profile is not None else None
    curve = CostCurve(measured.t_ms if measured else None, load_independent(profile, cand),
                      plain_t1_ms=getattr(settings, "plain_t1_ms", None))
    governor = ThreadGovernor(settings, auto, cores, profile, curve, apply=target.set_threads)
    if profile is not None and not measured_threads(profile, cand):
        governor.auto = False
    target.attach_machine(settings, governor)
