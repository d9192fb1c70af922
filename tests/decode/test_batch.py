"""Batched decoding (specframe.decode.batch, specframe.target.batch_kv): every request of a batch — ragged prompts,
chains and trees of different lengths, requests joining and leaving mid-run — decodes exactly what it decodes alone,
greedy and sampled (same seed, same tokens), with one target forward per step for the whole batch."""

from __future__ import annotations

import json
import random

import pytest

from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode.batch import BatchRequest, SequentialBatch, decode_batch, new_batch
from specframe.decode.engine import Engine
from specframe.errors import ConfigError, PromptTooLongError
from specframe.sampling import SamplingParams
from specframe.target.batch_kv import TransformersBatch
from specframe.target.hf import Target
from specframe_plugins.autoregressive import NoneConfig, NoProposer
from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
from specframe_plugins.eagle import EagleConfig, EagleProposer
from specframe_plugins.medusa import MedusaConfig, MedusaProposer
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import (
    ARCHS,
    PROMPT,
    PROMPT_2,
    VOCAB,
    build_model,
    build_tokenizer,
    check_metrics,
    draft_dir,
    policy_of,
    random_drafter,
    random_heads,
)

pytestmark = pytest.mark.device_subset

SAMPLING = SamplingParams(temperature=0.9, top_p=0.95)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Ragged prompts: the two with repeats, a one-token prompt, and random ones of 2..40 tokens."""
    rng = random.Random(seed)
    fixed = [PROMPT, PROMPT_2, [7], PROMPT_2 * 3]
    return (fixed + [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(2, 40))] for _ in range(n)])[:n]


def _budgets(n: int) -> list[int]:
    return [12 + 7 * (i % 4) for i in range(n)]  # different lengths: requests leave at different steps


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """arch -> (target, folder of medusa heads, draft-model folder, eagle folder)."""
    root = tmp_path_factory.mktemp("batch")
    out = {}
    for arch in ARCHS:
        model = build_model(arch, initializer_range=0.2)  # sharp attention: a wrong position or key changes tokens
        target = Target(model, build_tokenizer(), name="specframe-test-batch")
        heads = root / f"medusa-{arch}"
        random_heads(4, 1, seed=0).save(heads, "specframe-test-batch")
        eagle = root / f"eagle-{arch}"
        random_drafter(model, layers=(1, 2)).save(eagle)
        out[arch] = (target, heads, draft_dir(root, arch), eagle)
    return out


def _lineup(name: str, target: Target, heads, draft, eagle):
    """(proposers, merge policy) of one strategy; fresh instances (each request owns its own)."""
    info = target.info
    make = {
        "none": lambda: NoProposer(NoneConfig(), info),
        "ngram": lambda: NgramProposer(NgramConfig(k=5), info),
        "medusa": lambda: MedusaProposer(MedusaConfig(heads=str(heads)), info),
        "draft-model": lambda: DraftModelProposer(DraftModelConfig(model=str(draft), k=3, min_confidence=0.0), info),
        "eagle": lambda: EagleProposer(EagleConfig(weights=str(eagle)), info),
    }
    parts = name.split("+")
    return [make[p]() for p in parts], (policy_of("priority") if len(parts) > 1 else None)


def _engine(name, target, heads, draft, eagle, sampling=SamplingParams()):
    proposers, merge = _lineup(name, target, heads, draft, eagle)
    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    return Engine(target, proposers, verifier, merge=merge)


class _CountRows:
    """Wraps a model's forward: records the batch size of every call."""

    def __init__(self, model):
        self.model, self.sizes = model, []
        self.inner = model.forward

    def __enter__(self):
        def spy(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.sizes.append(int(ids.shape[0]))
            return self.inner(*args, **kwargs)

        self.model.forward = spy
        return self

    def __exit__(self, *exc):
        self.model.forward = self.inner


STRATEGIES = ["none", "ngram", "medusa", "draft-model", "ngram+medusa", "eagle"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLING], ids=["greedy", "sampled"])
def test_every_request_of_a_batch_equals_it_decoded_alone(env, arch, strategy, sampling):
    target, heads, draft, eagle = env[arch]
    prompts, budgets = _prompts(9), _budgets(9)
    alone = [_engine(strategy, target, heads, draft, eagle, sampling).generate(
        p, max_new_tokens=b, sampling=sampling, seed=i) for i, (p, b) in enumerate(zip(prompts, budgets))]
    items = [BatchRequest(_engine(strategy, target, heads, draft, eagle, sampling), p, b, sampling, seed=i)
             for i, (p, b) in enumerate(zip(prompts, budgets))]
    with _CountRows(target.model) as calls:  # (no gate: every row drafts as alone, so its forwards are alone's)
        got = dict(decode_batch(target, items, batch_size=4, gate=False))
    assert sorted(got) == list(range(9))
    for i in range(9):
        assert got[i].token_ids == alone[i].token_ids, f"request {i}"
        assert got[i].finish_reason == alone[i].finish_reason
        assert got[i].metrics.target_forwards == alone[i].metrics.target_forwards  # same drafts, same acceptance
        check_metrics(got[i])
    batched = isinstance(new_batch(target, 4), TransformersBatch)
    assert batched == (arch != "qwen2-sliding")  # a sliding window takes no per-row mask: one forward per request
    if batched:
        assert max(calls.sizes) == 4  # up to batch_size rows in one forward
        if strategy != "draft-model":  # (the draft model's own forwards are B = 1 too)
            verify_forwards = [s for s in calls.sizes if s > 1]
            # fewer forwards with several rows than the requests' verification forwards together
            assert len(verify_forwards) < sum(r.metrics.target_forwards for r in got.values()) / 2
    else:
        assert set(calls.sizes) == {1}


def test_batch_of_one_and_batch_of_all_agree(env):
    target, heads, draft, eagle = env["llama"]
    prompts, budgets = _prompts(6, seed=3), _budgets(6)
    outs = []
    for size in (1, 2, 6, 32):
        items = [BatchRequest(_engine("ngram+medusa", target, heads, draft, eagle), p, b) for p, b in
                 zip(prompts, budgets)]
        outs.append({i: r.token_ids for i, r in decode_batch(target, items, size, gate=False)})
    assert all(o == outs[0] for o in outs[1:])


def test_long_requests_compact_the_cache_and_stay_exact(env):
    """Holes from rejected drafts fill the cache; compaction gathers each row's columns, the output is unchanged."""
    target, heads, draft, eagle = env["llama"]
    prompts = _prompts(5, seed=7)
    alone = [_engine("medusa", target, heads, draft, eagle).generate(p, max_new_tokens=150).token_ids
             for p in prompts]
    batch = TransformersBatch(target)
    compactions = []
    real = batch._maybe_compact

    def spy():
        before = batch.width
        real()
        if batch.width < before:
            compactions.append((before, batch.width))

    batch._maybe_compact = spy
    items = [BatchRequest(_engine("medusa", target, heads, draft, eagle), p, 150) for p in prompts]
    got = {}
    it = _decode_with(batch, target, items, 5)
    for i, r in it:
        got[i] = r.token_ids
    assert [got[i] for i in range(5)] == alone
    assert compactions, "no compaction happened"


def _decode_with(batch, target, items, size):
    import specframe.decode.batch as mod

    real = mod.new_batch
    mod.new_batch = lambda t, rows: batch
    try:
        yield from decode_batch(target, items, size, gate=False)
    finally:
        mod.new_batch = real


def test_a_forward_that_raises_on_drafts_leaves_every_output_unchanged(env, monkeypatch, caplog):
    target, heads, draft, eagle = env["llama"]
    prompts, budgets = _prompts(5, seed=1), _budgets(5)
    alone = [_engine("ngram", target, heads, draft, eagle).generate(p, max_new_tokens=b).token_ids
             for p, b in zip(prompts, budgets)]
    inner = target.model.forward
    raised = []

    def refuse_long(*args, **kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[0] > 1 and ids.shape[1] > 3 and len(raised) < 3:
            raised.append(ids.shape)
            raise RuntimeError("refused")
        return inner(*args, **kwargs)

    monkeypatch.setattr(target.model, "forward", refuse_long)
    items = [BatchRequest(_engine("ngram", target, heads, draft, eagle), p, b) for p, b in zip(prompts, budgets)]
    got = dict(decode_batch(target, items, 5, gate=False))
    assert raised
    assert [got[i].token_ids for i in range(5)] == alone
    assert any("raised RuntimeError" in r.message for r in caplog.records)


def test_a_request_that_fails_to_start_gives_its_engine_back(env):
    target, heads, draft, eagle = env["llama"]
    released = []
    items = [BatchRequest(_engine("none", target, heads, draft, eagle), PROMPT, 5, release=lambda: released.append(0)),
             BatchRequest(_engine("none", target, heads, draft, eagle), [], 5, release=lambda: released.append(1))]
    with pytest.raises(ConfigError, match="empty"):
        list(decode_batch(target, items, 2))
    assert sorted(released) == [0, 1]


def test_batch_size_below_one_is_refused(env):
    target = env["llama"][0]
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        list(decode_batch(target, [], 0))


def test_targets_without_a_batched_forward_decode_one_request_per_forward(env):
    class Plain:  # no new_batch: e.g. a recorded trace
        pass

    assert isinstance(new_batch(Plain(), 4), SequentialBatch)


# --- faces -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sf(env):
    import specframe

    return specframe.load(target=env["llama"][0], max_new_tokens=16)


def test_generate_batch_equals_generate_one_by_one(sf):
    prompts = _prompts(5, seed=2)
    one = [sf.generate_result(p, proposers="ngram", max_new_tokens=20).token_ids for p in prompts]
    seen = []
    res = sf.generate_batch_results(prompts, batch_size=3, proposers="ngram", max_new_tokens=20,
                                    question_ids=list("abcde"), on_result=lambda i, r: seen.append(i))
    assert [r.token_ids for r in res] == one
    assert [r.question_id for r in res] == list("abcde")
    assert sorted(seen) == list(range(5))
    recs = sf.generate_batch(prompts[:2], batch_size=2, proposers="ngram", max_new_tokens=20)
    assert [r["token_ids"] for r in recs] == one[:2]


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(batch_size=True), "batch_size must be an integer >= 1"),
    (dict(question_ids=[1]), "question_ids has 1 entries for 2 prompts"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(question_ids=5), "question_ids must be a list"),  # (issue 55: were raw TypeErrors, on_result's after
    (dict(on_result=5), "on_result must be a function"),    # the whole batch had been generated)
])
def test_generate_batch_bad_arguments(sf, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        sf.generate_batch_results([PROMPT, PROMPT_2], **kwargs)


def test_generate_batch_takes_any_iterable_and_names_prompts_otherwise(sf):
    """Issue 55 (7): a generator of prompts is read into a list (it raised a raw ``TypeError: object of type
    'generator' has no len()``); what is no list of prompts gets one line naming ``prompts``."""
    prompts = _prompts(2, seed=4)
    want = sf.generate_batch_results(prompts, batch_size=2, max_new_tokens=6)
    got = sf.generate_batch_results(iter(prompts), batch_size=2, max_new_tokens=6)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert [r.token_ids for r in sf.generate_batch_results((p for p in prompts), max_new_tokens=6)] == \
        [r.token_ids for r in want]
    for bad in (5, None, {"a": 1}, "a prompt"):
        with pytest.raises(ConfigError, match="prompts must be a non-empty list"):
            sf.generate_batch_results(bad)
    with pytest.raises(ConfigError, match="prompts must be a non-empty list"):
        sf.generate_batch_results(iter([]))


def test_a_bad_cancel_is_refused_before_queueing_and_the_loop_lives_on(env):
    """Issue 55 (6): ``cancel=True`` raised ``AttributeError: 'bool' object has no attribute 'is_set'`` in the loop
    thread and every later ``submit`` hung; now it is one ConfigError at ``submit`` and the loop serves the next."""
    import threading

    import specframe

    sf = specframe.load(target=env["llama"][0], max_new_tokens=4, batch_size=2)
    try:
        for bad in (True, "yes", 1):
            with pytest.raises(ConfigError, match="cancel must be a threading.Event"):
                sf.submit([5, 6, 7], max_new_tokens=4, cancel=bad)
        assert sf.pending == 0
        ok = sf.submit([5, 6, 7], max_new_tokens=4, cancel=threading.Event()).result(timeout=60)
        assert ok.token_ids == sf.generate_result([5, 6, 7], max_new_tokens=4).token_ids
    finally:
        sf.close()


def test_generate_batch_checks_every_prompt_first(sf, monkeypatch):
    started = []
    import specframe.decode.batch as mod

    monkeypatch.setattr(mod, "decode_batch", lambda *a, **k: started.append(1) or iter(()))
    long = [1] * (sf.target.max_context + 1)
    with pytest.raises(PromptTooLongError, match="prompt 1 has"):
        sf.generate_batch_results([PROMPT, long])
    with pytest.raises(ConfigError, match="non-empty list"):
        sf.generate_batch_results([])
    with pytest.raises(ConfigError, match="prompt 0 is empty"):
        sf.generate_batch_results([[]])
    assert not started


def test_cli_batch_size_output_in_prompt_order(tmp_path, monkeypatch, env):
    from typer.testing import CliRunner

    import specframe.api
    import specframe.cli.commands
    from specframe.cli import app

    target = env["llama"][0]
    real_load = specframe.api.load
    monkeypatch.setattr(specframe.cli.commands, "load_with_progress", lambda cfg, reg: real_load(cfg, target=target))
    monkeypatch.setattr("specframe.target.models.resolve_model", lambda name: None)
    words = target.tokenizer.convert_ids_to_tokens
    f = tmp_path / "q.jsonl"
    prompts = _prompts(4, seed=5)
    f.write_text("".join(json.dumps({"question_id": i, "category": "x", "turns": [" ".join(words(p))]}) + "\n"
                         for i, p in enumerate(prompts)))
    args = ["generate", "--prompts-file", str(f), "--proposer", "ngram", "--max-new-tokens", "10", "--no-chat",
            "--json"]
    one = CliRunner().invoke(app, args)
    many = CliRunner().invoke(app, [*args, "--batch-size", "3"])
    assert one.exit_code == 0 and many.exit_code == 0, many.output
    def ids(out):
        return [(r["question_id"], r["token_ids"]) for r in map(json.loads, out.stdout.splitlines())]
    assert ids(many) == ids(one) and [q for q, _ in ids(many)] == [0, 1, 2, 3]


@pytest.mark.parametrize("extra, match", [
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--batch-size", "2", "--stream"], "--stream prints one answer"),
])
def test_cli_bad_batch_flags(tmp_path, no_model_load, extra, match):
    from typer.testing import CliRunner

    from specframe.cli import app

    f = tmp_path / "q.jsonl"
    f.write_text(json.dumps({"turns": ["aa ab"]}) + "\n")
    res = CliRunner().invoke(app, ["generate", "--prompts-file", str(f), *extra])
    assert res.exit_code != 0
    assert "error:" in res.output and match in res.output


# --- budgets over the batch ------------------------------------------------------------------------------------------


def test_the_router_shrinks_drafts_as_the_batch_grows(env):
    """A perfect drafter (the reference itself) on a cost curve that is flat up to 8 tokens per forward and
    compute-bound beyond (v(n) = max(1, n / 8)): alone a request verifies its whole draft; in a batch of B rows the
    forward runs B * (widest row) tokens, so each request's draft shrinks to what still fits in 8 tokens (B = 2: 3
    nodes, B = 4: 1) and stops at B = 8 but for probes — and every output stays the reference."""
    from specframe_plugins.router import AdaptiveConfig, AdaptiveRouter

    from tests.fakes import ScriptedChain, hf_greedy

    target = env["llama"][0]
    curve = [max(1.0, n / 8) for n in range(1, 129)]
    prompts = _prompts(8, seed=4)
    refs = [hf_greedy(target.model, p, 24) for p in prompts]
    nodes = {}
    for size in (1, 2, 4, 8):
        items = [BatchRequest(Engine(target, [ScriptedChain(target.info, ref, k=7)], GreedyVerifier(),
                                     router=AdaptiveRouter(AdaptiveConfig(cost_curve=curve), target.info)), p, 24)
                 for p, ref in zip(prompts, refs)]
        got = dict(decode_batch(target, items, size, gate=False))  # (the router alone: no measured gate)
        assert [got[i].token_ids for i in range(8)] == refs
        # every request runs with `size` rows throughout (8 requests, all the same length)
        nodes[size] = sum(r.metrics.drafted_nodes for r in got.values()) / sum(
            r.metrics.target_forwards for r in got.values())
    assert nodes[1] > 5  # alone: (nearly) the whole 7-node draft
    assert 2 <= nodes[2] <= 3 + 1e-9
    assert 0.5 <= nodes[4] <= 1 + 1e-9
    assert nodes[8] <= 0.25  # (only the router's one-node probes, which ask whether drafting pays again)
    assert nodes[1] > nodes[2] > nodes[4] > nodes[8]


# --- specframe bench with concurrency --------------------------------------------------------------------------------


def test_bench_under_load_writes_the_table_plots_and_a_lossless_check(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import app

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n" for i, t in
                         enumerate(["aa ab ac aa ab", "ba bb bc ba bb bd", "ca cb", "da db dc da db dc", "ea"])))
    model_dir = tmp_path / "tiny-model"
    build_model("llama", initializer_range=0.2).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({
        "model": str(model_dir), "dtype": "float32", "threads": 1, "prepack": False, "chat": False,
        "max_new_tokens": 10, "concurrency": [1, 3], "strategies": [
            {"name": "ngram", "proposers": ["ngram"]}, {"name": "hf-greedy", "peer": "hf-greedy"}]}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["bench", "--config", str(cfg), "--questions", str(q), "--output", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    results = json.loads((out / "results.json").read_text())
    load = {(r["strategy"], r["concurrency"]): r for r in results["load"]}
    assert set(load) == {(s, c) for s in ("none", "ngram", "hf-greedy") for c in (1, 3)}
    for r in load.values():
        assert len(r["requests"]) == 5 and r["tokens"] == sum(x["new_tokens"] for x in r["requests"])
        assert r["throughput"] == pytest.approx(r["tokens"] / r["wall_s"])
    alone = [x["token_ids"] for x in load[("none", 1)]["requests"]]
    for key in (("none", 3), ("ngram", 1), ("ngram", 3)):
        assert [x["token_ids"] for x in load[key]["requests"]] == alone
        assert all(x["ttft_s"] > 0 for x in load[key]["requests"])
    assert [m for m in results["lossless"] if m["kind"] == "specframe"] == []
    report = (out / "report.md").read_text()
    assert "| ngram | 3 |" in report and "throughput_by_concurrency.png" in report
    assert (out / "nodes_by_concurrency.png").stat().st_size > 0


def test_bench_concurrency_refuses_peers_that_cannot_batch(tmp_path):
    from specframe.bench.config import load_bench_config

    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({"concurrency": [1, 4], "strategies": [
        {"name": "lookup", "peer": "hf-prompt-lookup"}]}))
    with pytest.raises(ConfigError, match="peer hf-prompt-lookup cannot decode batches"):
        load_bench_config(cfg)
    cfg.write_text(json.dumps({"concurrency": [0], "strategies": [{"name": "ngram", "proposers": ["ngram"]}]}))
    with pytest.raises(ConfigError, match="concurrency must list distinct numbers >= 1"):
        load_bench_config(cfg)


# --- threads feeding one batch ---------------------------------------------------------------------------------------


def test_threads_calling_generate_share_the_batch_and_get_their_own_outputs(env):
    """With batch_size 4, six threads' requests are decoded together (forwards with several rows) and each gets what
    it gets alone — streamed text included; a client whose on_text raises fails alone."""
    import threading

    import specframe

    target = env["llama"][0]
    alone_sf = specframe.load(target=target, max_new_tokens=20)
    prompts = _prompts(6, seed=9)
    want = [alone_sf.generate_result(p, proposers="ngram", max_new_tokens=20 + i).token_ids
            for i, p in enumerate(prompts)]
    sf = specframe.load(target=target, max_new_tokens=20, batch_size=4)
    got, texts, errors = [None] * 6, [[] for _ in range(6)], []
    barrier = threading.Barrier(7)

    def worker(i):
        barrier.wait()
        try:
            got[i] = sf.generate_result(prompts[i], proposers="ngram", max_new_tokens=20 + i,
                                        on_text=texts[i].append)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def bad_client():
        barrier.wait()

        def boom(piece):
            raise OSError("the client hung up")

        with pytest.raises(OSError, match="hung up"):
            sf.generate_result(PROMPT, proposers="ngram", max_new_tokens=30, on_text=boom)

    with _CountRows(target.model) as calls:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)] + [threading.Thread(target=bad_client)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    sf.close()
    assert not errors, errors
    assert [r.token_ids for r in got] == want
    assert ["".join(t) for t in texts] == [r.text for r in got]
    assert max(calls.sizes) > 1  # requests of several threads shared forwards


@pytest.mark.skipif(__import__("importlib").util.find_spec("economize") is None,
                    reason="economize (PyPI) is a peer, not a dependency: pip install economize")
def test_bench_under_load_runs_economize_as_a_peer(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from specframe.cli import app

    monkeypatch.setenv("SPECFRAME_CACHE", str(tmp_path / "cache"))
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [t]}) + "\n" for i, t in
                         enumerate(["aa ab ac aa ab", "ba bb bc ba bb bd", "ca cb"])))
    model_dir = tmp_path / "tiny-model"
    build_model("llama", initializer_range=0.2).save_pretrained(model_dir)
    build_tokenizer().save_pretrained(model_dir)
    cfg = tmp_path / "b.yaml"
    cfg.write_text(json.dumps({
        "model": str(model_dir), "dtype": "float32", "threads": 1, "prepack": False, "chat": False,
        "max_new_tokens": 10, "concurrency": [1, 3], "strategies": [
            {"name": "economize", "peer": "economize-batch"},
            {"name": "economize-lookup", "peer": "economize-batch", "options": {"lookup": True}}]}))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["bench", "--config", str(cfg), "--questions", str(q), "--output", str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    load = {(r["strategy"], r["concurrency"]): r for r in json.loads((out / "results.json").read_text())["load"]}
    alone = [x["token_ids"] for x in load[("none", 1)]["requests"]]
    for key in (("economize", 1), ("economize", 3), ("economize-lookup", 3)):
        assert [x["token_ids"] for x in load[key]["requests"]] == alone


def test_the_gate_turns_drafting_off_where_plain_steps_commit_more_per_second_and_probes_back():
    from specframe.decode.batch_gate import SpeculationGate

    gate = SpeculationGate(alpha=0.5, probe_every=5, probe_steps=2, margin=0.0)
    rates = {True: 50.0, False: 100.0}  # at 8 rows, drafting steps commit 50 tokens/s, plain ones 100
    modes = []
    for _ in range(30):
        mode = gate.draft_now(8)
        modes.append(mode)
        gate.observe(committed=10, seconds=10 / rates[mode])
    assert modes[:4] == [True, True, False, False]  # two steps drafting, then a paired probe without
    assert modes[4:9] == [False] * 5 and modes[9:11] == [True, True] and modes[11] is False  # off; a probe
    assert gate.gain(8) == pytest.approx(0.5)
    for _ in range(300):  # a verdict the probes keep confirming: they come ever less often (5, 10, 20, then every 40 steps)
        mode = gate.draft_now(8)
        modes.append(mode)
        gate.observe(committed=10, seconds=10 / rates[mode])
    assert modes[30:].count(True) <= 24 and gate.ledgers[8].every == 8 * 5  # (without backing off: 120)
    assert gate.draft_now(1) is True  # alone: the router's own cost model decides
    rates[True] = 400.0  # drafting starts to pay: the next probe (within 40 steps now) turns it back on
    for _ in range(45):
        gate.observe(committed=10, seconds=10 / rates[mode := gate.draft_now(8)])
    assert gate.ledgers[8].drafting is True


def test_the_gate_compares_adjacent_runs_so_a_change_in_what_the_batch_holds_does_not_flip_it():
    """Drafting commits 20 % more per second at every moment; at step 100 a long prompt joins and every step gets
    twice as slow. Rates averaged over long stretches would set drafting steps measured after the join against plain
    ones measured before it; the paired runs see the same cache."""
    from specframe.decode.batch_gate import SpeculationGate

    gate = SpeculationGate(probe_every=24, probe_steps=3, margin=0.03)
    modes = []
    for step in range(400):
        mode = gate.draft_now(8)
        modes.append(mode)
        slow = 2.0 if step >= 100 else 1.0
        gate.observe(committed=12 if mode else 10, seconds=0.1 * slow)
    assert gate.ledgers[8].drafting is True and gate.gain(8) == pytest.approx(1.2)
    assert modes[100:].count(False) <= 3 * 6


def test_the_gate_rates_a_run_by_its_tokens_over_its_seconds_not_by_the_mean_of_step_rates():
    from specframe.decode.batch_gate import SpeculationGate

    gate = SpeculationGate(probe_every=50, probe_steps=2, margin=0.0)
    for i in range(4):  # drafting: a long step (10 tokens in 1 s) and a short one (1 token in 10 ms); plain: 15/s
        mode = gate.draft_now(8)
        gate.observe(*(((10, 1.0) if i == 0 else (1, 0.01)) if mode else (3, 0.2)))
    assert gate.gain(8) == pytest.approx((11 / 1.01) / 15)  # (the mean of the two step rates, 55, would say draft)
    assert gate.ledgers[8].drafting is False


def test_a_batch_size_not_measured_yet_starts_in_the_nearest_measured_verdict():
    from specframe.decode.batch_gate import SpeculationGate

    gate = SpeculationGate(probe_every=20, probe_steps=2, margin=0.0)
    rates = {True: 50.0, False: 100.0}
    for _ in range(6):
        gate.observe(committed=10, seconds=10 / rates[gate.draft_now(8)])
    assert gate.ledgers[8].drafting is False
    seen = []
    for _ in range(3):
        seen.append(gate.draft_now(7))
        gate.observe(10, 10 / rates[seen[-1]])
    assert seen == [False, False, True]  # 8 does not draft: 7 starts plain, then probes drafting
    assert gate.draft_now(2) is False  # nearest measured: 8 (7 has no pair yet)


def test_with_the_gate_greedy_rows_equal_alone_and_sampled_rows_draft_as_alone(env):
    target, heads, draft, eagle = env["llama"]
    prompts, budgets = _prompts(9), _budgets(9)
    for sampling in (SamplingParams(), SAMPLING):
        alone = [_engine("ngram", target, heads, draft, eagle, sampling).generate(p, max_new_tokens=b,
                 sampling=sampling, seed=i) for i, (p, b) in enumerate(zip(prompts, budgets))]
        items = [BatchRequest(_engine("ngram", target, heads, draft, eagle, sampling), p, b, sampling, seed=i)
                 for i, (p, b) in enumerate(zip(prompts, budgets))]
        got = dict(decode_batch(target, items, batch_size=4))  # the gate on (the default)
        for i in range(9):
            assert got[i].token_ids == alone[i].token_ids, (sampling, i)
            if sampling.temperature > 0:  # never gated: the same drafts, so the same draws
                assert got[i].metrics.target_forwards == alone[i].metrics.target_forwards


def test_the_load_bench_checks_a_llamacpp_strategy_against_llamacpp_decoding_alone():
    """A llama.cpp strategy's requests are compared with llama.cpp's own plain decoding at the smallest concurrency,
    not with transformers' `none` (another model's arithmetic: every request would "diverge")."""
    from specframe.bench.load import lossless_records
    from specframe.bench.runner import lossless_check

    hf = {"engine": "transformers", "dtype": "bfloat16", "prepack": True}
    gguf = {"engine": "llama.cpp", "dtype": "auto", "prepack": False}

    def rec(strategy, c, tokens, settings, plain):
        return {"strategy": strategy, "concurrency": c, "kind": "specframe", "plain": plain, "settings": settings,
                "requests": [{"question": 0, "question_id": 7, "token_ids": tokens}]}

    load = [rec("none", 1, [1, 2, 3], hf, True), rec("llamacpp-none", 1, [1, 5, 6], gguf, True),
            rec("llamacpp-none", 8, [1, 5, 6], gguf, True), rec("llamacpp-ngram", 8, [1, 5, 6], gguf, False),
            rec("ngram", 8, [1, 2, 3], hf, False)]
    assert lossless_check(None, lossless_records(load), [], chat=False) == []


def test_faults_in_one_request_of_eight_stay_in_that_request(env, monkeypatch):
    """Issue 55 (b): in a batch of 8 decoded by the loop thread, one request's proposer raises at every step, one
    client's ``on_text`` raises, and the shared target forward raises on its first drafted calls: the raising client's
    request alone fails (with its own error), every other request finishes token-identical to it decoded alone, and
    the loop serves the next request."""
    from specframe import ProposerBase, ProposerConfig
    from specframe.decode.scheduler import BatchScheduler

    class Raising(ProposerBase):
        name = "raising"

        def propose(self, state, budget):
            raise RuntimeError("plugin bug")

    target, heads, draft, eagle = env["llama"]
    prompts, budgets = _prompts(8, seed=11), _budgets(8)
    alone = [_engine("ngram", target, heads, draft, eagle).generate(p, max_new_tokens=b).token_ids
             for p, b in zip(prompts, budgets)]
    inner, raised = target.model.forward, []

    def flaky_forward(*args, **kwargs):  # the shared forward fails on its first two drafted batches
        ids = kwargs["input_ids"]
        if ids.shape[0] > 1 and ids.shape[1] > 1 and len(raised) < 2:
            raised.append(tuple(ids.shape))
            raise RuntimeError("kernel failure")
        return inner(*args, **kwargs)

    def hangs_up(piece):
        raise OSError("the client hung up")

    items = []
    for i, (p, b) in enumerate(zip(prompts, budgets)):
        engine = _engine("ngram", target, heads, draft, eagle)
        if i == 1:
            engine = Engine(target, [Raising(ProposerConfig(name="raising"), target.info),
                                     NgramProposer(NgramConfig(k=5), target.info)], GreedyVerifier(),
                            merge=policy_of("priority"))
        items.append(BatchRequest(engine, p, b, on_text=hangs_up if i == 3 else None))
    monkeypatch.setattr(target.model, "forward", flaky_forward)
    scheduler = BatchScheduler(target, 8)
    try:
        futures = [scheduler.submit(item) for item in items]
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(timeout=120).token_ids)
            except OSError as exc:
                outcomes.append(exc)
        after = scheduler.submit(BatchRequest(_engine("ngram", target, heads, draft, eagle), prompts[0], budgets[0]))
        assert after.result(timeout=120).token_ids == alone[0]
    finally:
        scheduler.close()
    assert raised  # the forward did fail
    assert isinstance(outcomes[3], OSError) and "hung up" in str(outcomes[3])
    assert [o for i, o in enumerate(outcomes) if i != 3] == [a for i, a in enumerate(alone) if i != 3]
