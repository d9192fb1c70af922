"""The target side on CUDA, checked on the CPU (issue 69): dtype ``auto`` on a GPU, ``float16``, ``cuda:N`` device
names, synchronised timing, the measured and cached CUDA cost curve, and the load probes in low-precision dtypes.

There is no GPU here: ``torch.cuda``'s answers (is a GPU there, its name, capability, native bf16) are faked with
monkeypatch, and "CUDA" models run on the CPU. Each test asserts a value the code under test computes.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
import torch

import specframe.target.device_sync as device_sync
import specframe.target.profile as tune
from specframe.config import SpecframeConfig
from specframe.errors import ConfigError
from specframe.target.cost import CostCurve, time_points
from specframe.target.models import check_device, cuda_native_bf16, resolve_dtype
from specframe.target.probes import cached_forward_obstacle, tree_forward_obstacle

# --- a faked CUDA machine ----------------------------------------------------------------------------------------


def fake_gpus(monkeypatch, count: int = 2, name: str = "NVIDIA A100-SXM4-80GB", capability=(8, 0),
              native_bf16: bool | None = None, old_torch: bool = False) -> list:
    """Make ``torch.cuda`` report ``count`` GPUs of this name and capability. ``native_bf16``: what
    ``is_bf16_supported(including_emulation=False)`` answers (default: capability >= 8.0); ``old_torch``: a torch whose
    ``is_bf16_supported`` takes no argument (before 2.4). Returns the log of ``(call, device)`` asked."""
    asked: list = []
    current = {"index": 0}
    native = capability[0] >= 8 if native_bf16 is None else native_bf16

    def is_bf16_supported(*args, **kwargs):
        if old_torch and (args or kwargs):
            raise TypeError("is_bf16_supported() takes 0 positional arguments")
        asked.append(("is_bf16_supported", current["index"], kwargs.get("including_emulation")))
        return True if kwargs.get("including_emulation", True) else native  # (emulated: always "supported")

    @contextlib.contextmanager
    def device(dev):
        old = current["index"]
        current["index"] = torch.device(dev).index
        try:
            yield
        finally:
            current["index"] = old

    def capability_of(dev=None):
        asked.append(("capability", dev))
        return capability

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: name)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    return asked


# --- dtype auto on CUDA, float16 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu, capability, want", [
    ("NVIDIA H100 80GB HBM3", (9, 0), torch.bfloat16),
    ("NVIDIA A100-SXM4-80GB", (8, 0), torch.bfloat16),
    ("NVIDIA GeForce RTX 4090", (8, 9), torch.bfloat16),
    ("Tesla T4", (7, 5), torch.float16),  # bf16 only emulated: fp16, not fp32
    ("Tesla V100-SXM2-16GB", (7, 0), torch.float16),
])
@pytest.mark.parametrize("old_torch", [False, True])
def test_auto_on_cuda_is_bf16_only_where_native_else_fp16(monkeypatch, gpu, capability, want, old_torch):
    asked = fake_gpus(monkeypatch, name=gpu, capability=capability, old_torch=old_torch)
    assert resolve_dtype("auto", "cuda") == want
    assert resolve_dtype("auto", "cuda:1") == want
    if old_torch:  # no including_emulation: the capability decides
        assert ("capability", torch.device("cuda:1")) in asked
    else:  # never the emulating answer (True on a T4 with CUDA 11+)
        assert {a[2] for a in asked if a[0] == "is_bf16_supported"} == {False}


def test_cuda_n_asks_that_gpu_not_the_current_one(monkeypatch):
    asked = fake_gpus(monkeypatch)
    cuda_native_bf16("cuda:1")
    cuda_native_bf16("cuda")
    assert [a[1] for a in asked if a[0] == "is_bf16_supported"] == [1, 0]


def test_explicit_dtypes_and_the_cpu_rule(monkeypatch):
    assert resolve_dtype("float16", "cpu") == torch.float16
    assert resolve_dtype("float16", "cuda:0") == torch.float16
    assert resolve_dtype("bfloat16", "cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert resolve_dtype("auto", "cpu") == torch.float32  # (the CPU rule is unchanged: no fp16 there)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    with pytest.raises(ConfigError, match="bfloat16, float16, float32 or auto, got 'half'"):
        resolve_dtype("half", "cuda")


@pytest.mark.parametrize("native, dtype, reason", [
    (True, "bfloat16", "native bf16"),
    (False, "float16", "no native bf16"),
])
def test_the_settings_of_a_cuda_target_name_the_dtype_and_why(monkeypatch, tmp_path, native, dtype, reason):
    fake_gpus(monkeypatch, native_bf16=native)
    s, profile, _ = tune.resolve_settings(tmp_path, "tiny", "cuda:1", "auto")
    assert (s.dtype, profile) == (dtype, None) and reason in s.dtype_reason
    s, _, _ = tune.resolve_settings(tmp_path, "tiny", "cuda", "float16")
    assert (s.dtype, s.dtype_reason) == ("float16", "as given")


def test_config_takes_float16():
    assert SpecframeConfig(dtype="float16").dtype == "float16"
    with pytest.raises(ValueError, match="dtype"):
        SpecframeConfig(dtype="half")


# --- device names ------------------------------------------------------------------------------------------------


def test_check_device_takes_cpu_cuda_and_cuda_n(monkeypatch):
    fake_gpus(monkeypatch, count=2)
    for ok in ("cpu", "cuda", "cuda:0", "cuda:1"):
        check_device(ok)
    with pytest.raises(ConfigError, match=r"cuda:2: this process sees 2 CUDA devices \(cuda:0 to cuda:1"):
        check_device("cuda:2")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1.0", "CUDA", "cuda:١", "mps", ""])
def test_a_bad_device_name_is_one_clear_error(monkeypatch, bad):
    fake_gpus(monkeypatch)
    with pytest.raises(ConfigError, match=r"device must be cpu, cuda or cuda:N"):
        check_device(bad)
    with pytest.raises(ValueError, match=r"device must be cpu, cuda or cuda:N"):
        SpecframeConfig(device=bad)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_a_gpu_is_refused(monkeypatch, device):
    fake_gpus(monkeypatch, count=0)
    with pytest.raises(ConfigError, match=f"device {device} was asked for but no CUDA device is available"):
        check_device(device)
    assert SpecframeConfig(device=device).device == device  # (the config only checks the name; the load checks it)


def test_the_typed_config_checks_the_device_too():
    from specframe.config import load_config

    assert load_config(None, device="cuda:2").device == "cuda:2"
    with pytest.raises(ConfigError, match="cpu, cuda or cuda:N"):
        load_config(None, device="gpu:0")


def _train(argv):
    from typer.testing import CliRunner

    from specframe.cli import app

    return CliRunner().invoke(app, ["train", *argv])


@pytest.mark.parametrize("argv, needle", [
    (["draft", "--output", "OUT", "--device", "gpu"], "device must be cpu, cuda or cuda:N"),
    (["draft", "--output", "OUT", "--device", "cuda:1"], "device cuda:1 was asked for but no CUDA device"),
    (["corpus", "--output", "OUT", "--device", "cuda"], "device cuda was asked for but no CUDA device"),
    (["draft", "--output", "OUT", "--dtype", "half"], "--dtype must be bfloat16, float16 or float32"),
])
def test_the_training_cli_refuses_a_bad_or_absent_device_in_one_error_line(monkeypatch, tmp_path, argv, needle):
    fake_gpus(monkeypatch, count=0)
    res = _train([str(tmp_path / "out") if a == "OUT" else a for a in argv])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert needle in lines[0]


def test_the_training_cli_passes_cuda_n_and_float16_to_the_loader(monkeypatch, tmp_path):
    fake_gpus(monkeypatch, count=2)
    got = {}


    def load_target(model, dtype, device, **kw):
        got.update(dtype=dtype, device=device)
        raise ConfigError("stop here")  # (nothing to train: the flags reached the loader)

    monkeypatch.setattr("specframe.target.loader.load_target", load_target)
    res = _train(["draft", "--output", str(tmp_path / "out"), "--device", "cuda:1", "--dtype", "float16"])
    assert got == {"dtype": "float16", "device": "cuda:1"}, res.output
    assert res.exit_code == 2 and "error: stop here" in res.output


# --- synchronised timing -----------------------------------------------------------------------------------------


class AsyncTarget:
    """A target on a fake asynchronous device: ``forward`` over n tokens only queues ``n * per_token_s`` of work
    and returns at once; the work is done when the device is synchronised (the patched ``synchronize`` sleeps it)."""

    def __init__(self, per_token_s: float) -> None:
        self.device = torch.device("cpu")
        self.per_token_s = per_token_s
        self.queued = 0.0
        self.log: list = []

    def new_cache(self):
        return []

    def forward(self, block, cache):
        self.queued += block.shape[1] * self.per_token_s
        cache.extend([0] * block.shape[1])
        self.log.append(("forward", block.shape[1]))

    def rollback(self, cache, length):
        del cache[length:]

    def synchronize(self, device):
        assert device == self.device
        self.log.append(("sync", None))
        time.sleep(self.queued)
        self.queued = 0.0


def test_time_points_waits_for_the_devices_work(monkeypatch):
    """Timed without synchronising, the forwards below would take microseconds (they only queue work); synchronised,
    T(n) is the queued n * 4 ms, and the 128-token prefill's work is not counted in T(1)."""
    target = AsyncTarget(per_token_s=0.004)
    monkeypatch.setattr(device_sync, "synchronize", target.synchronize)
    t_ms = time_points(target, list(range(50)), context=128, ns=[1, 4], repeats=2)
    assert 4.0 <= t_ms[0] < 30.0  # (not the prefill's 512 ms)
    assert 16.0 <= t_ms[1] < 60.0
    # every timed forward sits between two synchronisations; a warm-up forward precedes each n
    forwards = [i for i, e in enumerate(target.log) if e[0] == "forward"]
    timed = forwards[2:4] + forwards[5:7]  # (prefill, warm-up n=1, 2 timed, warm-up n=4, 2 timed)
    assert all(target.log[i - 1][0] == "sync" and target.log[i + 1][0] == "sync" for i in timed)


def test_measure_keeps_its_shape_and_times_synchronised(monkeypatch):
    from specframe.target.cost import measure

    target = AsyncTarget(per_token_s=0.002)
    monkeypatch.setattr(device_sync, "synchronize", target.synchronize)
    prof = measure(target, [1, 2, 3], context=8, max_tokens=3, repeats=1)
    assert set(prof) == {"context", "repeats", "t_ms", "v"} and len(prof["t_ms"]) == 3
    assert prof["t_ms"][2] >= 6.0 and prof["v"][0] == 1.0


# --- the CUDA cost curve: measured once per GPU model, dtype and model, cached ------------------------------------


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


class CurveTarget:
    device = torch.device("cuda:1")
    vocab_size = 64
    max_context = 2048


def timed(monkeypatch, rows: list) -> list:
    """Patch the timing: each measurement returns the next row of ``rows`` (a call past them fails the test);
    returns the log of ``(context, ns, repeats)`` asked."""
    asked = []

    def fake(target, ids, context, ns, repeats=5, progress=None):
        asked.append((context, list(ns), repeats))
        assert len(ids) >= context + max(ns)
        return rows[len(asked) - 1]

    monkeypatch.setattr("specframe.target.cost.time_points", fake)
    return asked


ROW = [10.0, 10.2, 10.5, 11.0, 12.0, 14.0, 20.0]  # T(n) ms at CUDA_NS: flat to 16 tokens, as on a big GPU


def test_the_curve_is_measured_once_and_read_from_the_cache(cache, monkeypatch):
    fake_gpus(monkeypatch)
    asked = timed(monkeypatch, [ROW])
    lines = []
    curve = tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16", log_line=lines.append)
    assert asked == [(512, [1, 2, 4, 8, 16, 32, 64], 5)]
    assert isinstance(curve, CostCurve) and curve.ns == tune.CUDA_NS
    assert curve.v(16) == pytest.approx(1.2) and curve.v(64) == pytest.approx(2.0) and curve.t1_ms() == 10.0
    assert curve.plain_t1_ms is None and curve.v_fixed(16) == pytest.approx(1.2)
    files = list((cache / "machine").glob("cuda-*.json"))
    assert len(files) == 1 and "A100" in lines[0] and str(files[0]) in lines[0]
    doc = json.loads(files[0].read_text())
    assert doc["gpu"]["gpu"] == "NVIDIA A100-SXM4-80GB" and doc["gpu"]["capability"] == [8, 0]
    assert (doc["model"], doc["dtype"], doc["t_ms"]) == ("tiny-m", "bfloat16", ROW)
    # the second load (any GPU index of the same model) reads the file: no measurement
    again = tune.cuda_cost_curve(type("T", (CurveTarget,), {"device": torch.device("cuda:0")})(), "tiny-m", "bfloat16")
    assert len(asked) == 1 and again.v(16) == pytest.approx(1.2)


@pytest.mark.parametrize("change", ["gpu", "capability", "dtype", "model"])
def test_another_gpu_dtype_or_model_is_measured_again(cache, monkeypatch, change):
    fake_gpus(monkeypatch)
    asked = timed(monkeypatch, [ROW, [5.0, 6.0, 8.0, 12.0, 20.0, 36.0, 68.0]])
    tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16")
    model, dtype = "tiny-m", "bfloat16"
    if change == "gpu":
        fake_gpus(monkeypatch, name="Tesla T4", capability=(8, 0))
    elif change == "capability":
        fake_gpus(monkeypatch, capability=(9, 0))
    elif change == "dtype":
        dtype = "float16"
    else:
        model = "other-m"
    curve = tune.cuda_cost_curve(CurveTarget(), model, dtype)
    assert len(asked) == 2 and curve.v(2) == pytest.approx(1.2)
    assert len(list((cache / "machine").glob("cuda-*.json"))) == 2


def test_measure_false_reads_only_the_cache_and_refresh_measures_again(cache, monkeypatch):
    fake_gpus(monkeypatch)
    asked = timed(monkeypatch, [ROW, [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    assert tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16", measure=False) is None and not asked
    tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16")
    assert tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16", measure=False).v(64) == pytest.approx(2.0)
    assert tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16", refresh=True).v(64) == 1.0 and len(asked) == 2


def test_a_short_context_model_is_timed_within_its_positions(cache, monkeypatch):
    fake_gpus(monkeypatch)
    asked = timed(monkeypatch, [ROW])
    tune.cuda_cost_curve(type("T", (CurveTarget,), {"max_context": 300})(), "tiny-m", "float16")
    assert asked[0][0] == 300 - 64


def test_a_failed_measurement_leaves_no_curve_and_no_file(cache, monkeypatch, caplog):
    fake_gpus(monkeypatch)

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("specframe.target.cost.time_points", oom)
    assert tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16") is None
    assert "out of memory" in caplog.text and not list(cache.glob("machine/cuda-*.json"))


def test_a_damaged_cache_file_is_measured_again(cache, monkeypatch):
    fake_gpus(monkeypatch)
    asked = timed(monkeypatch, [ROW, ROW])
    tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16")
    path = next((cache / "machine").glob("cuda-*.json"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "t_ms": [1.0, 2.0]}))  # fewer points than ns
    assert tune.cuda_cost_curve(CurveTarget(), "tiny-m", "bfloat16").v(64) == pytest.approx(2.0) and len(asked) == 2


def _model_dir(tmp_path):
    from tests.fakes import build_model, build_tokenizer

    model = tmp_path / "tiny-m"
    build_model("llama").to("cpu").save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    return model


def test_the_loader_hands_a_cuda_target_its_measured_curve(tmp_path, cache, monkeypatch):
    """load_target on "cuda:1" (the model really on the CPU here): the curve is measured by real synchronised
    forwards, cached, and is the target's ``info.cost`` (what routers read); the next load reads the file."""
    import specframe.target.models as models
    from specframe.target.loader import load_target

    fake_gpus(monkeypatch, capability=(7, 5))  # a T4: auto = fp16
    placed = []
    real_load = models.load_model

    def load_model(directory, dtype, device, tokenizer=True):
        placed.append((dtype, device))
        return real_load(directory, torch.float32, "cpu", tokenizer)  # (no GPU: fp32 on the CPU)

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr(tune, "CUDA_NS", (1, 2, 4))
    monkeypatch.setattr(tune, "CUDA_REPEATS", 1)
    monkeypatch.setattr(tune, "CUDA_CONTEXT", 32)
    monkeypatch.setattr(tune, "measure_cuda_curve", _defaults_now(tune.measure_cuda_curve))
    model = _model_dir(tmp_path)
    t = load_target(str(model), device="cuda:1")
    assert placed == [(torch.float16, "cuda:1")] and t.settings.dtype == "float16"
    assert t.info.cost is not None and t.info.cost.ns == (1, 2, 4) and t.info.cost.t1_ms() > 0
    doc = json.loads(next((cache / "machine").glob("cuda-*.json")).read_text())
    assert (doc["model"], doc["dtype"], doc["context"], doc["gpu"]["gpu"]) == ("tiny-m", "float16", 32,
                                                                               "NVIDIA A100-SXM4-80GB")

    def no_measuring(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(tune, "measure_cuda_curve", no_measuring)
    again = load_target(str(model), device="cuda:1")
    assert again.info.cost.t_ms == t.info.cost.t_ms


def _defaults_now(fn):
    """``measure_cuda_curve`` reading the module's (patched) defaults at call time."""
    def call(target, key, model_name, dtype):
        return fn(target, key, model_name, dtype, tune.CUDA_NS, tune.CUDA_CONTEXT, tune.CUDA_REPEATS)
    return call


def test_a_cpu_target_never_measures_a_cuda_curve(tmp_path, cache, monkeypatch):
    from specframe.target.loader import load_target

    def no_cuda(*a, **k):
        raise AssertionError("a CUDA curve for a CPU target")

    monkeypatch.setattr(tune, "cuda_cost_curve", no_cuda)
    t = load_target(str(_model_dir(tmp_path)), dtype="float32", prepack=False, threads=1, measure=False)
    assert t.settings.dtype == "float32" and t.info.cost is None  # (no profile cached here: nothing measured)


# --- load probes in low-precision dtypes -------------------------------------------------------------------------


def _tiny(dtype):
    from specframe.testing.tiny import tiny_target

    return tiny_target(device="cpu").model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_sound_model_passes_the_probes_in_every_dtype(dtype):
    model = _tiny(dtype)
    assert cached_forward_obstacle(model) is None and tree_forward_obstacle(model) is None


class Runner:
    """The probes' runner with a fault in multi-token forwards: ``negate`` (they compute something else) or
    ``overflow`` (one logit is +inf, as an fp16 overflow gives)."""

    def __init__(self, model, fault: str) -> None:
        from specframe.target.probes import CacheRunner

        self.inner, self.fault = CacheRunner(model), fault

    def new_cache(self):
        return self.inner.new_cache()

    def rollback(self, cache, length):
        self.inner.rollback(cache, length)

    def forward(self, cache, ids, **kw):
        logits = self.inner.forward(cache, ids, **kw)
        if ids.shape[1] == 1:
            return logits
        if self.fault == "negate":
            return -logits
        logits = logits.clone()
        logits[..., 3] = float("inf")
        return logits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_multi_token_forward_that_computes_something_else_is_refused_in_low_precision(dtype):
    why = cached_forward_obstacle(_tiny(dtype), Runner(_tiny(dtype), "negate"))
    assert why is not None and "below the best" in why


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_overflow_is_refused_in_low_precision(dtype):
    why = cached_forward_obstacle(_tiny(dtype), Runner(_tiny(dtype), "overflow"))
    assert why is not None and "infinite logits" in why and str(dtype).removeprefix("torch.") in why


def test_an_fp16_model_whose_logits_overflow_is_refused():
    """A real overflow: the head's weights scaled so its products outgrow float16's 65 504."""
    model = _tiny(torch.float16)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3e4)
    why = cached_forward_obstacle(model)
    assert why is not None and "float16" in why


def test_a_ruled_out_token_is_no_overflow():
    """-inf logits (a token the head rules out, the same in both paths) pass in low precision."""
    model = _tiny(torch.bfloat16)

    class Masking(Runner):
        def forward(self, cache, ids, **kw):
            logits = self.inner.forward(cache, ids, **kw).clone()
            logits[..., 5] = float("-inf")
            return logits

    assert cached_forward_obstacle(model, Masking(model, "")) is None


# --- scripts/check_exactness.py --device ------------------------------------------------------------------------


def _check_exactness():
    import importlib.util

    from tests.fakes import ROOT

    spec = importlib.util.spec_from_file_location("check_exactness", ROOT / "scripts" / "check_exactness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, want", [([], "cpu"), (["--device", "cuda:1"], "cuda:1")])
def test_check_exactness_loads_the_target_on_its_device(monkeypatch, capsys, argv, want):
    script = _check_exactness()
    got = {}

    def load(**kw):
        got.update(kw)
        raise ConfigError("stop here")

    monkeypatch.setattr(script.specframe, "load", load)
    monkeypatch.setattr("sys.argv", ["check_exactness.py", *argv])
    assert script.main() == 2 and got["device"] == want
    assert capsys.readouterr().err.strip() == "error: stop here"


def test_check_exactness_refuses_a_bad_device_in_one_line(monkeypatch, capsys):
    script = _check_exactness()
    monkeypatch.setattr("sys.argv", ["check_exactness.py", "--device", "gpu"])
    assert script.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "cpu, cuda or cuda:N" in err[0]


@pytest.mark.parametrize("capability, native", [((8, 0), True), ((7, 0), False), ((7, 5), False), ((9, 0), True)])
def test_training_autocasts_to_bf16_only_on_a_gpu_that_computes_it_natively(monkeypatch, capability, native):
    """A V100 (7.0) or T4 (7.5) only emulates bf16: the training recipes (EAGLE, DFlash) run their drafter in float32
    there instead of under a slower emulated autocast."""
    from types import SimpleNamespace

    from specframe.training.dflash import _bf16
    from specframe.training.eagle import native_bf16_on

    fake_gpus(monkeypatch, capability=capability)
    assert native_bf16_on(torch.device("cuda", 1)) is native
    assert _bf16(SimpleNamespace(autocast=True), SimpleNamespace(device=torch.device("cuda", 0))) is native
    assert _bf16(SimpleNamespace(autocast=False), SimpleNamespace(device=torch.device("cuda", 0))) is False
