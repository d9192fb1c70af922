"""Loading a target to run: the model (:mod:`specframe.target.models`), the settings this machine's profile chooses
(:mod:`specframe.target.profile`: dtype, threads, weight layout) and the target adapter (:class:`specframe.target.hf.Target`)."""

from __future__ import annotations

from typing import Callable

import torch

from .cost import CostCurve


def load_target(name_or_path: str, dtype: str = "auto", device: str = "cpu",
                log: Callable[[str], None] = lambda s: None, threads: int | str = "auto", prepack: bool | str = "auto",
                speculative: bool = True, progress=None, measure: bool | None = None, engine: str = "transformers",
                engine_options: dict | None = None):
    """Resolve, convert (once) and load a target. Returns a :class:`specframe.target.hf.Target`, or for ``engine``
    ``llama.cpp`` a :class:`specframe.target.llamacpp.target.LlamaCppTarget` (``engine_options``: the config's ``llamacpp``
    settings; :func:`specframe.target.llamacpp.loader.load_llamacpp_target`).

    ``dtype``, ``threads`` and ``prepack`` set to ``auto`` are chosen from this machine's measured profile
    (:mod:`specframe.target.profile`; measured once when ``dtype`` is auto, with a bar on ``progress``); the chosen settings
    and reasons are ``target.settings``, the live cost curve v(n) is ``target.info.cost``, and
    ``target.governor`` keeps the thread count within the free cores during a run. On CUDA (``device`` ``cuda`` or
    ``cuda:N``) dtype ``auto`` is bf16 where the GPU computes it natively, else fp16, and ``target.info.cost`` is
    this GPU's measured curve (:func:`specframe.target.profile.cuda_cost_curve`: measured once per GPU model, dtype
    and model, then cached; only a cached one when ``measure`` is False). A cache entry that fails to load is
    rebuilt once.

    Raises:
        ConfigError: bad device or dtype name, CUDA asked for where there is none, or ``prepack`` asked for where it
            is not available; an unknown engine.
    """
    if engine == "llama.cpp":
        from .llamacpp.loader import load_llamacpp_target

        return load_llamacpp_target(name_or_path, dtype, device, log, threads, prepack, speculative, progress, measure,
                                    engine_options)
    if engine != "transformers":
        from ..errors import ConfigError

        raise ConfigError(f"engine must be transformers or llama.cpp, got {engine!r}")
    from .models import check_device, convert_gguf, load_model, model_directory, resolve_dtype, resolve_model
    from .packed import pack_linears
    from .profile import Candidate, ThreadGovernor, load_independent, resolve_settings
    from .state_target import make_target

    check_device(device)
    if dtype != "auto":
        resolve_dtype(dtype, device)  # a bad name: the one-line error, before anything loads
    source = resolve_model(name_or_path)
    directory = model_directory(source, log)
    settings, profile, _ = resolve_settings(directory, source.name, device, dtype, threads, prepack, speculative,
                                            progress, measure)
    if device == "cpu":
        torch.set_num_threads(settings.threads)
    torch_dtype = resolve_dtype(settings.dtype, device)
    try:
        model, tok = load_model(directory, torch_dtype, device)
    except (OSError, ValueError, RuntimeError):
        if source.gguf is None:
            raise
        log(f"cache entry {directory} is unreadable; rebuilding it")
        convert_gguf(source.gguf, directory, log)
        model, tok = load_model(directory, torch_dtype, device)
    if settings.prepack:
        pack_linears(model)
    target = make_target(model, tok, name=source.name)
    from .machine import usable_cores

    measured = profile.find(Candidate(settings.dtype, settings.threads, settings.prepack)) if profile else None
    curve = CostCurve(measured.t_ms if measured else None,
                      load_independent(profile, Candidate(settings.dtype, settings.threads, settings.prepack)),
                      plain_t1_ms=settings.plain_t1_ms)  # (the reference speculation must beat: the router reads it)
    if profile is None and torch.device(device).type == "cuda":  # this GPU's measured curve (no CPU profile there)
        from .profile import cuda_cost_curve

        curve = cuda_cost_curve(target, source.name, settings.dtype, measure, log_line=log) or curve
    target.attach_machine(settings, ThreadGovernor(settings, threads == "auto" and device == "cpu",
                                                   usable_cores()[0], profile, curve))
    return target
