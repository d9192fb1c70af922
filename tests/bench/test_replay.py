"""Replay (specframe.replay): against a trace recorded from a tiny random target, the replay of lookup proposers
(ngram, retrieval, both combined, with and without a router and a cost curve) equals the live engine exactly — τ,
tokens, acceptance by position and per-proposer attribution — and medusa / eagle (which read recorded hidden states)
come within tolerance; the trace format round-trips and refuses what it must; a misbehaving plugin cannot crash a
replay."""

from __future__ import annotations

import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import specframe
from specframe import DraftTree, ProposerBase, hookimpl
from specframe.datastore import build_datastore
from specframe.errors import TraceError
from specframe.io.atomic import replace_folder
from specframe.registry import build_registry
from specframe.replay.driver import Request, TraceScorer, TraceVerifier
from specframe.replay.record import record_trace
from specframe.replay.sweep import Task, run_here
from specframe.replay.trace import VERSION, check_trace_matches, read_trace, write_trace
from specframe.target.cost import CostCurve
from specframe.target.hf import Target

from tests.fakes import (
    NAME,
    REPLAY_CURVE,
    REPLAY_PROMPTS,
    VOCAB,
    build_model,
    build_tokenizer,
    draft_dir,
    random_drafter,
    random_heads,
    replay_target,
)
from tests.fakes import REPLAY_N_NEW as N_NEW


def corpus(trace, seed: int = 0) -> list[list[int]]:
    """Documents for a retrieval datastore: each recorded sequence with every 5th generated token changed (twice,
    once more corrupted), plus random text: retrieval finds partial continuations and wrong branches."""
    rng = random.Random(seed)
    docs = []
    for q in trace.questions:
        seq = q.tokens
        for copies, every in ((2, 5), (1, 3)):
            changed = [t if i < len(q.prompt) or (i - len(q.prompt)) % every else (t + 1 + rng.randrange(VOCAB - 2))
                       % (VOCAB - 1) + 1 for i, t in enumerate(seq)]
            docs += [changed] * copies
    return docs + [[rng.randrange(1, VOCAB) for _ in range(50)] for _ in range(20)]


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    """arch -> (specframe over the target, the trace recorded from it, a datastore folder)."""
    root = tmp_path_factory.mktemp("replay")
    out = {}
    for arch in ("llama", "qwen2-sliding"):
        sf = specframe.load(target=replay_target(arch, curve=True), registry=build_registry(), chat=False)
        trace = record_trace(sf, REPLAY_PROMPTS, max_new_tokens=N_NEW, chat=False)
        replace_folder(root / arch, lambda tmp: write_trace(trace, tmp))
        trace = read_trace(root / arch)
        ds = build_datastore(corpus(trace), root / f"ds-{arch}", vocab_size=VOCAB).path
        out[arch] = (sf, trace, str(ds))
    return out


def strategies(ds: str) -> dict[str, dict]:
    retrieval = {"name": "retrieval", "datastore": ds, "max_nodes": 8}
    # routing that reads no clock: deterministic. (The default, measure: auto, times drafts and forwards under greedy
    # decoding: live, the tiny model's forward takes its own time, in the replay the curve's T(1) v(n).)
    never = {"name": "adaptive", "measure": "never"}
    return {
        "ngram": {"proposers": [{"name": "ngram"}], "router": "none"},  # a lone proposer, not routed
        "ngram k4 routed": {"proposers": [{"name": "ngram", "k": 4, "max_n": 3}], "router": never},
        "retrieval": {"proposers": [retrieval], "router": "none"},
        "retrieval routed": {"proposers": [retrieval], "router": never},
        "ngram+retrieval": {"proposers": [{"name": "ngram"}, retrieval], "router": "none"},
        "ngram+retrieval adaptive": {"proposers": [{"name": "ngram"}, retrieval], "router": never,
                                     "merge": {"policy": "confidence", "max_nodes": 12}},
        "retrieval+ngram priority 6": {"proposers": [retrieval, {"name": "ngram"}], "router": never,
                                       "merge": {"policy": "priority", "max_nodes": 6}},
    }


def replay(sf, trace, name: str, s: dict, max_new: int = N_NEW) -> list[dict]:
    task = Task({"name": name, "merge": None, "router": None, **s}, tuple(Request(i) for i in range(len(trace.questions))),
                max_new)
    (res,) = run_here(sf.target, sf.registry, trace, [task])
    return res.records


ATTRIBUTION = ("steps", "skipped_steps", "proposed_nodes", "drafted_nodes", "accepted_nodes", "accepted_alone",
               "wasted_nodes", "faults", "drafted_by_depth", "accepted_by_depth")
COUNTS = ("new_tokens", "target_forwards", "drafted_nodes", "accepted_nodes", "drafted_by_depth",
          "accepted_by_depth", "proposer_faults")


@pytest.mark.parametrize("arch", ["llama", "qwen2-sliding"])
@pytest.mark.parametrize("name", list(strategies("")))
def test_replay_of_lookup_proposers_equals_the_live_engine(envs, arch, name):
    sf, trace, ds = envs[arch]
    s = strategies(ds)[name]
    records = replay(sf, trace, name, s)
    drafted = 0
    for rec, q in zip(records, trace.questions):
        live = sf.generate_result(q.prompt, proposers=s["proposers"], max_new_tokens=N_NEW, merge=s.get("merge"),
                                  router=s.get("router"))
        m, lm = rec["metrics"], live.metrics.to_dict()
        assert rec["token_ids"] == live.token_ids == q.generated
        assert {k: m[k] for k in COUNTS} == {k: lm[k] for k in COUNTS}, q.question_id
        assert m["tau"] == lm["tau"]  # τ, exactly
        assert {label: {k: p[k] for k in ATTRIBUTION} for label, p in m["proposers"].items()} == \
               {label: {k: p[k] for k in ATTRIBUTION} for label, p in lm["proposers"].items()}
        drafted += m["accepted_nodes"]
    assert drafted > 0  # the proposers had something to draft: the comparison is not vacuous


def test_replay_models_the_forward_time_from_the_cost_curve(envs):
    sf, trace, ds = envs["llama"]
    (rec,) = replay(sf, trace, "ngram", {"proposers": [{"name": "ngram"}], "router": "none"})[:1]
    m = rec["metrics"]
    cost = CostCurve.from_manifest(trace.manifest["cost"])
    assert cost.t1_ms() == pytest.approx(11.0)  # mean T(1) over the two contexts
    # v(n) is T(n)/T(1) averaged over the contexts (specframe.target.cost.CostCurve): v(8) = (17/10 + 19/12) / 2
    assert cost.seconds(1) == pytest.approx(0.011) and cost.seconds(8) == pytest.approx(0.011 * (1.7 + 19 / 12) / 2)
    # every step costs at least T(1); a step over n tokens T(1) v(n) <= T(1) v(max)
    assert m["target_forwards"] * 0.011 <= m["forward_s"] + 1e-9
    assert m["wall_s"] == pytest.approx(m["forward_s"] + m["propose_s"])
    assert m["replay_s"] > 0 and m["prefill_s"] == 0.0


def test_trace_scorer_answers_each_row_with_the_recorded_next_token(envs):
    _, trace, _ = envs["llama"]
    q = trace.questions[0]
    scorer = TraceScorer(q, (), False, 2, CostCurve.from_manifest(None))
    g = q.generated
    # a tree: node 0 = g[0] (right), node 1 = wrong sibling, node 2 = child of node 0 = g[1] (right), node 3 under 2 wrong
    wrong = (g[0] + 1) % VOCAB
    draft = DraftTree(torch.tensor([[g[0], wrong, g[1], (g[2] + 1) % VOCAB]]), torch.tensor([[-1, -1, 0, 2]]))
    scored = scorer.score(torch.tensor([[q.prompt[-1]]]), draft)
    assert scored.logits.tolist() == [[g[0], g[1], g[1], g[2], g[3]]]  # by depth: 0, 1, 1, 2, 3
    result = TraceVerifier().verify(draft, scored.logits, None, None)
    assert result.accepted_nodes == ((0, 2),) and result.next_token == (g[2],)  # deepest matching path, bonus g[2]
    scorer.keep([0, 2])
    chain = DraftTree.chain([g[3], g[4]])
    assert scorer.score(torch.tensor([[g[2]]]), chain).logits.tolist() == [[g[3], g[4], g[5]]]


@pytest.fixture(scope="module")
def medusa_env(tmp_path_factory):
    from specframe.learned.medusa_heads import MedusaHeads

    root = tmp_path_factory.mktemp("medusa-replay")
    zero, rand = root / "zero", root / "random"
    MedusaHeads(32, 4, 1).save(zero, NAME)  # the LM head's own top tokens: repeats get accepted
    random_heads(3, 2, std=0.05, seed=3).save(rand, NAME)
    sf = specframe.load(target=replay_target("llama", curve=True), registry=build_registry(), chat=False)
    return sf, zero, rand


@pytest.mark.parametrize("heads", ["zero", "random"])
@pytest.mark.parametrize("recorded_with", ["none", "ngram"])
def test_medusa_replay_is_within_tolerance_of_live(medusa_env, heads, recorded_with):
    """Medusa reads the last hidden state, recorded from the recording run's forwards (1-token forwards for none,
    chains for ngram) while live it comes from medusa's own tree forwards: equal up to float rounding, so τ may
    differ where rounding flips a near-tie among the heads' candidates (here it does not)."""
    sf, zero, rand = medusa_env
    med = {"name": "medusa", "heads": str(zero if heads == "zero" else rand)}
    trace = record_trace(sf, REPLAY_PROMPTS, max_new_tokens=N_NEW, chat=False, proposers=[{"name": recorded_with}],
                         features_for=[med])
    assert trace.feature_layers == {2: "last"}  # the last layer (2 decoder layers), from the prompt's end on
    for name, proposers in (("medusa", [med]), ("ngram+medusa", [{"name": "ngram"}, med])):
        records = replay(sf, trace, name, {"proposers": proposers, "router": "none"})
        tokens = forwards = accepted = 0
        for rec, q in zip(records, trace.questions):
            live = sf.generate_result(q.prompt, proposers=proposers, max_new_tokens=N_NEW, router="none")
            tokens += live.metrics.new_tokens
            forwards += live.metrics.target_forwards
            accepted += live.metrics.proposers["medusa"].accepted_nodes
            assert rec["token_ids"] == live.token_ids
        tau_live = tokens / forwards
        tau_replay = sum(r["metrics"]["new_tokens"] for r in records) / sum(r["metrics"]["target_forwards"] for r in records)
        assert abs(tau_replay - tau_live) <= 0.02 * tau_live, (name, tau_replay, tau_live)
        if heads == "zero":
            assert accepted > 0


def test_recorded_hidden_states_are_what_the_live_engine_hands_medusa(medusa_env):
    """The rows a replay feeds medusa equal, up to float rounding, the hidden states the live engine handed it."""
    from specframe_plugins.medusa import MedusaConfig, MedusaProposer

    sf, zero, _ = medusa_env
    med = {"name": "medusa", "heads": str(zero)}
    trace = record_trace(sf, REPLAY_PROMPTS[:2], max_new_tokens=N_NEW, chat=False, features_for=[med])
    seen: dict[str, list] = {"live": [], "replay": []}

    class Spy(MedusaProposer):
        where = "live"

        def propose(self, state, budget):
            seen[self.where].append((state.tokens.shape[1], state.hidden.clone()))
            return super().propose(state, budget)

    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine
    from specframe.replay.driver import fixed_engine, replay_requests

    target = sf.target
    live = Engine(target, [Spy(MedusaConfig(heads=str(zero)), target.info)], GreedyVerifier())
    for q in trace.questions:
        live.generate(q.prompt, max_new_tokens=N_NEW)
    spy = Spy(MedusaConfig(heads=str(zero)), target.info)
    spy.where = "replay"
    engine = Engine(target, [spy], TraceVerifier())
    replay_requests(lambda: fixed_engine(engine), trace, [Request(0), Request(1)], N_NEW)
    assert [n for n, _ in seen["live"]] == [n for n, _ in seen["replay"]]
    diff = max(float((a - b).abs().max()) for (_, a), (_, b) in zip(seen["live"], seen["replay"]))
    assert diff < 1e-5


def test_eagle_replay_is_within_tolerance_of_live(tmp_path):
    """EAGLE reads three layers at every committed position (prompt included): the trace holds them all."""
    model = build_model("llama", num_hidden_layers=4)
    folder = tmp_path / "eagle"
    random_drafter(model, layers=(1, 2, 4)).save(folder)
    target = Target(model, build_tokenizer(), name=NAME)
    sf = specframe.load(target=target, registry=build_registry(), chat=False)
    eagle = {"name": "eagle", "weights": str(folder)}
    trace = record_trace(sf, REPLAY_PROMPTS, max_new_tokens=N_NEW, chat=False, features_for=[eagle])
    assert trace.feature_layers == {1: "all", 2: "all", 4: "all"}
    q = trace.questions[0]
    assert q.features[1][1].shape == (len(q.tokens) - 1, 32)  # every processed position
    for name, proposers in (("eagle", [eagle]), ("ngram+eagle", [{"name": "ngram"}, eagle])):
        records = replay(sf, trace, name, {"proposers": proposers, "router": "none"})
        lives = [sf.generate_result(q.prompt, proposers=proposers, max_new_tokens=N_NEW, router="none")
                 for q in trace.questions]
        tau_live = sum(r.metrics.new_tokens for r in lives) / sum(r.metrics.target_forwards for r in lives)
        tau_replay = sum(r["metrics"]["new_tokens"] for r in records) / sum(r["metrics"]["target_forwards"] for r in records)
        assert abs(tau_replay - tau_live) <= 0.02 * tau_live, (name, tau_replay, tau_live)


def test_block_drafter_replay_is_within_tolerance_of_live(tmp_path):
    """A DFlash block drafter reads two target layers at every committed position: the trace holds them, and replay
    gives the live τ, alone (whole blocks and the router's trims) and combined with ngram."""
    from specframe.learned import dflash as df

    model = build_model("llama", num_hidden_layers=4)
    folder = tmp_path / "dflash"
    df.save_dflash(df.DFlashDrafter.new(model.config, df.DFLASH, num_layers=1, target_layer_ids=(0, 2), block_size=6,
                                        mask_token_id=3, seed=2), folder)
    target = Target(model, build_tokenizer(), name=NAME)
    sf = specframe.load(target=target, registry=build_registry(), chat=False)
    block = {"name": "dflash", "checkpoint": str(folder), "candidates": 2}
    trace = record_trace(sf, REPLAY_PROMPTS, max_new_tokens=N_NEW, chat=False, features_for=[block])
    assert trace.feature_layers == {1: "all", 3: "all"}
    for name, proposers in (("dflash", [block]), ("ngram+dflash", [{"name": "ngram"}, block])):
        records = replay(sf, trace, name, {"proposers": proposers, "router": "none"})
        lives = [sf.generate_result(q.prompt, proposers=proposers, max_new_tokens=N_NEW, router="none")
                 for q in trace.questions]
        assert [r["token_ids"] for r in records] == [r.token_ids for r in lives]
        tau_live = sum(r.metrics.new_tokens for r in lives) / sum(r.metrics.target_forwards for r in lives)
        tau_replay = sum(r["metrics"]["new_tokens"] for r in records) / sum(r["metrics"]["target_forwards"] for r in records)
        assert abs(tau_replay - tau_live) <= 0.02 * tau_live, (name, tau_replay, tau_live)


def test_a_strategy_reading_features_the_trace_lacks_is_refused(envs, medusa_env):
    sf, zero, _ = medusa_env
    _, trace, _ = envs["llama"]  # recorded without features
    with pytest.raises(TraceError, match="last hidden state.*--features-for"):
        replay(sf, trace, "medusa", {"proposers": [{"name": "medusa", "heads": str(zero)}]})


# --- a misbehaving plugin ---------------------------------------------------------------------------------------


class Faulty(ProposerBase):
    name = "faulty-replay"

    def propose(self, state, budget):
        if state.num_generated % 3 == 1:
            raise RuntimeError("boom")
        return DraftTree.chain([0] * budget)  # garbage, or an out-of-contract draft below


class Broken(ProposerBase):
    name = "broken-replay"

    def __init__(self, config, target):
        raise RuntimeError("cannot build")


class _Plugin:
    @hookimpl
    def specframe_register_proposers(self, register):
        register(Faulty)
        register(Broken)


@pytest.mark.parametrize("proposers", [["faulty-replay"], ["broken-replay"], ["faulty-replay", "ngram"],
                                       ["broken-replay", "ngram"]])
def test_a_misbehaving_plugin_never_crashes_a_replay(envs, proposers, caplog):
    sf0, trace, _ = envs["llama"]
    sf = specframe.load(target=sf0.target, registry=build_registry(extra_plugins=(_Plugin(),)), chat=False)
    records = replay(sf, trace, "x", {"proposers": [{"name": p} for p in proposers], "router": "none"})
    assert [r["token_ids"] for r in records] == [q.generated for q in trace.questions]
    assert all(r["metrics"]["proposer_faults"] >= 1 for r in records)
    assert "output is unaffected" in caplog.text


# --- the trace format -------------------------------------------------------------------------------------------


def test_trace_round_trip_and_manifest(envs, tmp_path):
    _, trace, _ = envs["llama"]
    m = trace.manifest
    assert m["format"] == "specframe-trace" and m["version"] == VERSION and m["specframe"] == specframe.__version__
    assert m["model"] == NAME and m["dtype"] == "float32" and m["max_new_tokens"] == N_NEW
    assert m["recorded_with"] == [{"name": "none"}] and m["features"] is None
    assert m["cost"]["t_ms"] == {str(k): v for k, v in REPLAY_CURVE.items()}
    assert [q["question_id"] for q in m["questions"]] == [p.question_id for p in REPLAY_PROMPTS]
    assert [q.category for q in trace.questions] == [p.category for p in REPLAY_PROMPTS]
    assert 0 < m["bytes_per_token"]["token_ids"] < 8  # gzip'd ids
    again = tmp_path / "again"
    replace_folder(again, lambda tmp: write_trace(trace, tmp))
    assert (again / "tokens.json.gz").read_bytes() == (trace.path / "tokens.json.gz").read_bytes()  # deterministic
    back = read_trace(again)
    assert [q.tokens for q in back.questions] == [q.tokens for q in trace.questions]
    payload = json.loads(gzip.decompress((again / "tokens.json.gz").read_bytes()))
    assert payload[0]["prompt"] == trace.questions[0].prompt


def _copy(trace, tmp_path) -> Path:
    out = tmp_path / "copy"
    replace_folder(out, lambda tmp: write_trace(trace, tmp))
    return out


@pytest.mark.parametrize("damage, needle", [
    (lambda d: (d / "tokens.json.gz").write_bytes((d / "tokens.json.gz").read_bytes()[:-7]), r"truncated \(\d+ of \d+ bytes\)"),
    (lambda d: (d / "tokens.json.gz").write_bytes(b"x" + (d / "tokens.json.gz").read_bytes()[1:]), "was altered"),
    (lambda d: (d / "tokens.json.gz").unlink(), "is missing"),
    (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:-40]), "not valid JSON"),
    (lambda d: (d / "manifest.json").unlink(), "holds no manifest.json"),
    (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text().replace('"version": 1', '"version": 9')),
     "format version 9; this specframe reads version 1"),
])
def test_a_damaged_trace_is_refused(envs, tmp_path, damage, needle):
    _, trace, _ = envs["llama"]
    folder = _copy(trace, tmp_path)
    damage(folder)
    with pytest.raises(TraceError, match=needle):
        read_trace(folder)


def test_a_truncated_features_file_is_refused(medusa_env, tmp_path):
    sf, zero, _ = medusa_env
    trace = record_trace(sf, REPLAY_PROMPTS[:2], max_new_tokens=8, chat=False,
                         features_for=[{"name": "medusa", "heads": str(zero)}])
    folder = _copy(trace, tmp_path)
    f = folder / "features.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(TraceError, match="features.safetensors is truncated"):
        read_trace(folder)


def test_another_model_or_dtype_is_refused(envs):
    _, trace, _ = envs["llama"]
    check_trace_matches(trace, NAME, "float32")
    check_trace_matches(trace, NAME, "auto")
    with pytest.raises(TraceError, match=f"recorded with model '{NAME}', the config asks for 'other'"):
        check_trace_matches(trace, "other", "float32")
    with pytest.raises(TraceError, match="recorded in float32, the config asks for bfloat16"):
        check_trace_matches(trace, NAME, "bfloat16")


def test_replaying_more_tokens_than_recorded_is_refused(envs):
    sf, trace, _ = envs["llama"]
    with pytest.raises(TraceError, match=f"more than the trace .* holds \\({N_NEW}\\)"):
        replay(sf, trace, "ngram", {"proposers": [{"name": "ngram"}]}, max_new=N_NEW + 1)


def test_a_shorter_replay_is_the_recording_cut(envs):
    sf, trace, _ = envs["llama"]
    records = replay(sf, trace, "ngram", {"proposers": [{"name": "ngram"}]}, max_new=10)
    assert [r["token_ids"] for r in records] == [q.generated[:10] for q in trace.questions]


def test_a_draft_model_replays_as_live(envs, tmp_path):
    """A proposer with its own model and KV cache (rolled back to the committed prefix each step) replays exactly too."""
    sf, trace, _ = envs["llama"]
    draft = {"name": "draft-model", "model": str(draft_dir(tmp_path, "llama")), "k": 4}
    for name, proposers in (("draft-model", [draft]), ("ngram+draft-model", [{"name": "ngram"}, draft])):
        records = replay(sf, trace, name, {"proposers": proposers, "router": "none"})
        for rec, q in zip(records, trace.questions):
            live = sf.generate_result(q.prompt, proposers=proposers, max_new_tokens=N_NEW, router="none").metrics.to_dict()
            assert {k: rec["metrics"][k] for k in COUNTS} == {k: live[k] for k in COUNTS}, (name, q.question_id)
            assert {lab: {k: p[k] for k in ATTRIBUTION} for lab, p in rec["metrics"]["proposers"].items()} == \
                   {lab: {k: p[k] for k in ATTRIBUTION} for lab, p in live["proposers"].items()}


def _edit_manifest(folder: Path, edit) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    edit(m)
    (folder / "manifest.json").write_text(json.dumps(m))


def _set(path: str, value):
    """An edit setting the manifest field at ``path`` (``a/b/0``: a number indexes a list) to ``value``."""
    def edit(m):
        *parents, last = path.split("/")
        for key in parents:
            m = m[int(key)] if isinstance(m, list) else m[key]
        if isinstance(m, list):
            m[int(last)] = value
        else:
            m[last] = value
    return edit


MALFORMED = [
    ("files", []), ("files", ["tokens.json.gz"]), ("files", {"tokens.json.gz": 3}), ("files", {}), ("files/tokens.json.gz", {"bytes": "12"}),
    ("questions", {}), ("questions/0", "q"), ("questions/0/prompt_tokens", "53"), ("questions/0/finish_reason", "eos"),
    ("target", None), ("target/vocab_size", 1.5), ("target/eos_token_ids", 2), ("target/supports_trees", "yes"),
    ("recorded_with", "none"), ("recorded_with", []), ("recorded_with/0", {"k": 1}), ("model", 3),
    ("dtype", "half"), ("max_new_tokens", True), ("chat", "true"), ("cost", []), ("cost", {"t_ms": {"x": [1.0]}}),
    ("features", {"layers": {"3": "some"}}), ("features", "all"), ("bytes_per_token", []),
]


@pytest.mark.parametrize("path, value", MALFORMED, ids=[f"{p}={v!r}" for p, v in MALFORMED])
def test_every_malformed_manifest_field_is_one_trace_error(envs, tmp_path, path, value):
    _, trace, _ = envs["llama"]
    folder = _copy(trace, tmp_path)
    top = path.split("/")[0]
    _edit_manifest(folder, _set(path, value))
    with pytest.raises(TraceError) as info:
        read_trace(folder)
    message = str(info.value)
    assert "\n" not in message and "manifest.json" in message and top in message, message


def _rewrite_tokens(folder: Path, payload) -> None:
    """Replace tokens.json.gz and record its new size and checksum, so only its content is wrong."""
    import hashlib

    data = gzip.compress(json.dumps(payload).encode())
    (folder / "tokens.json.gz").write_bytes(data)
    _edit_manifest(folder, _set("files/tokens.json.gz", {"bytes": len(data),
                                                         "sha256": hashlib.sha256(data).hexdigest()}))


@pytest.mark.parametrize("change", ["not a list", "no prompt", "ids as strings", "outside the vocabulary", "a float id"])
def test_a_malformed_tokens_file_is_one_trace_error(envs, tmp_path, change):
    _, trace, _ = envs["llama"]
    folder = _copy(trace, tmp_path)
    payload = json.loads(gzip.decompress((folder / "tokens.json.gz").read_bytes()))
    if change == "not a list":
        payload = {"prompt": [1]}
    elif change == "no prompt":
        del payload[0]["prompt"]
    elif change == "ids as strings":
        payload[0]["generated"] = [str(t) for t in payload[0]["generated"]]
    elif change == "outside the vocabulary":
        payload[1]["prompt"][0] = 10**6
    else:
        payload[0]["prompt"][0] = 1.0
    _rewrite_tokens(folder, payload)
    with pytest.raises(TraceError, match="tokens.json.gz") as info:
        read_trace(folder)
    assert "\n" not in str(info.value)


def test_a_malformed_manifest_is_one_error_line_in_the_cli(tmp_path):
    from typer.testing import CliRunner

    from specframe import cli

    shipped = Path(specframe.__file__).parent / "testing" / "traces" / "smollm2-135m-instruct-fp32-dev"
    folder = tmp_path / "trace"
    shutil.copytree(shipped, folder)
    _edit_manifest(folder, _set("files", ["tokens.json.gz"]))
    cfg = tmp_path / "r.yaml"
    cfg.write_text("dtype: float32\nstrategies: [{name: ngram, proposers: [ngram]}]\n")
    res = CliRunner().invoke(cli.app, ["replay", "--traces", str(folder), "--config", str(cfg), "--output",
                                       str(tmp_path / "out"), "--no-ray"])
    assert res.exit_code == 2, (res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "files" in lines[0], res.stderr
    assert not (tmp_path / "out").exists()
