"""The tests' one fakes module: what several test modules build, fake or compare against, in one place.

- tiny randomly initialised HF causal LMs (float32, on :func:`test_device`: the CPU unless ``--device`` or
  ``SPECFRAME_TEST_DEVICE`` says otherwise) and a word-level tokenizer whose vocabulary matches them,
  a byte-level BPE pair for structured output, and references for plain greedy decoding;
- checks every test shares (the metrics that must agree, one user-error line), a live server;
- for combining: drafts, step reports, scripted proposers, an HF draft folder, merge policies by name;
- learned proposers' random weights (Medusa heads, an EAGLE drafter); a scripted successor target's helpers;
- replay: the questions, cost curve and target the replay tests record from, and the CLI's trace;
- a synthetic machine profile;
- proposers with one realistic bug each, for testing the conformance kit itself;
- the source of a trivial plugin module, for the plugin-discovery tests.

Fixtures live in conftest.py (tests/ and the folders'); this module only builds. Every model is built from a config
here and seeded with ``torch.manual_seed``; nothing is downloaded.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import Field
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from specframe import DraftTree, ProposerBase, ProposerConfig
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.contracts.combining import ProposerStep
from specframe.decode.engine import Engine, GenerationResult
from specframe.io.prompts import Prompt
from specframe.learned.eagle_drafter import EagleDrafter, EagleSpec, init_from_target, new_drafter
from specframe.learned.medusa_heads import MedusaHeads
from specframe.sampling import SamplingParams, probs_from_logits
from specframe.target.cost import CostCurve
from specframe.target.hf import Target
from specframe.target.profile import Candidate, MachineProfile, Measured
from specframe.testing.tiny import default_device, tiny_target
from specframe_plugins.autoregressive import NoneConfig, NoProposer
from specframe_plugins.merge_policies import ConfidenceConfig, ConfidencePolicy, PriorityConfig, PriorityPolicy

# Tiny models spend their time in thread wake-ups, not arithmetic: one thread is ~20x faster on 2 cores.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]  # the repository
SPECBENCH = ROOT.parent / "shared" / "specbench" / "question.jsonl"  # Spec-Bench's questions, beside the checkout
NAME = "specframe-test-tiny-no-shipped-weights"  # a target name no shipped weights are ever found for


# --- the device tests run on ------------------------------------------------------------------------------------------


def test_device() -> torch.device:
    """The device the tests' models live on: ``$SPECFRAME_TEST_DEVICE`` (tests/conftest.py sets it from ``--device``,
    which wins), else the CPU. A function, read at each call, so builders called outside fixtures follow it too."""
    return default_device()


test_device.__test__ = False  # not a test, wherever a test module imports it


# --- tiny models and tokenizers ---------------------------------------------------------------------------------------

VOCAB = 64
HIDDEN = 32  # every tiny model's hidden size (tiny_config)
# id 0 is the (special) pad token; ids 1..63 are two-letter words, so no word is a substring of another and a
# stop string made of whole words can only match at word boundaries in the decoded text ("aa ab ac ...").
WORDS = ["<pad>"] + ["".join(p) for p in itertools.product("abcdefgh", repeat=2)][: VOCAB - 1]

# llama and qwen2 (full attention), and qwen2 with a sliding-window layer (window 8 < the sequences we decode),
# which exercises KV rollback of sliding-window layers (``activate_past_recording`` + ``crop``).
ARCHS = ("llama", "qwen2", "qwen2-sliding")

# Prompts with repeated n-grams, so that the ngram proposer drafts from the first step.
PROMPT = [5, 9, 12, 7, 5, 9, 12, 30, 41, 5, 9]
PROMPT_2 = [17, 3, 3, 44, 17, 3, 21, 60, 8, 17, 3]


def tiny_config(arch: str, **overrides):
    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    common.update(overrides)
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "qwen2-sliding":
        return Qwen2Config(**common, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    raise ValueError(arch)


def build_model(arch: str, seed: int = 0, **overrides):
    """A tiny random causal LM in float32, eval mode, on :func:`test_device`, with no EOS (tests that need one set
    it). The weights are drawn on the CPU, then moved: a seed gives the same weights on every device."""
    torch.manual_seed(seed)
    cfg = tiny_config(arch, **overrides)
    cls = LlamaForCausalLM if arch == "llama" else Qwen2ForCausalLM
    model = cls(cfg).float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(test_device())


BPE_EOS = 0
BPE_CORPUS = ['{"name": "Ada", "age": 36, "tags": ["x", "y"], "ok": true}', '{"city": "Paris", "zip": "75001"}',
              'true false null 0123456789 -1.5e3', '[1, 2, 3] {"a": {"b": null}}', "abc-123 xyz_9 a.b@c.de"]


def build_bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (400 tokens, ``<eos>`` = id 0) trained on JSON-like text: real byte tokens, as a
    grammar engine needs (the word-level one has none)."""
    from tokenizers import decoders, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(BPE_CORPUS * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def build_bpe_model(tokenizer: PreTrainedTokenizerFast, seed: int = 3, max_positions: int = 512):
    """A tiny random llama over ``tokenizer`` with EOS (id 0), whose LM head is its embedding (x4): it likes to repeat
    itself, so ngram and lookahead draft and get accepted. On :func:`test_device`."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                      eos_token_id=BPE_EOS)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight * 4)
    model.generation_config.eos_token_id = BPE_EOS
    model.generation_config.pad_token_id = BPE_EOS
    return model.to(test_device())


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over :data:`WORDS` (whitespace split); decode joins words with one space."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


# a word-level tokenizer's chat template: "<role> content" per message, then the assistant's turn
CHAT_TEMPLATE = ("{% for m in messages %}{{ 'aa ' if m['role'] == 'user' else 'ab ' }}{{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}ac{% endif %}")


def chat_target(**model_kw) -> Target:
    """A tiny Llama target named ``tiny`` whose word-level tokenizer has :data:`CHAT_TEMPLATE` (the servers' tests)."""
    tok = build_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return Target(build_model("llama", **model_kw), tok, name="tiny")


# --- references and shared checks -------------------------------------------------------------------------------------


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | list[int] | None = None,
              pad: int = 0) -> list[int]:
    """Plain greedy decoding by transformers ``generate`` on the model's device (stops after ``eos``, one id or
    several, when given)."""
    ids = torch.tensor([prompt], dtype=torch.int64, device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    return out[0, len(prompt) :].tolist()


def plain_generate(target: Target, prompt: list[int], max_new_tokens: int, **kwargs) -> GenerationResult:
    """The engine with the ``none`` proposer: one target forward per token."""
    sampling = kwargs.pop("sampling", SamplingParams())
    verifier = GreedyVerifier() if sampling.is_greedy else SpeculativeSamplingVerifier()
    engine = Engine(target, [NoProposer(NoneConfig(), target.info)], verifier)
    return engine.generate(prompt, max_new_tokens=max_new_tokens, sampling=sampling, **kwargs)


def check_metrics(result: GenerationResult) -> None:
    """Counters that must agree with each other and with the output, whatever the proposer."""
    m = result.metrics
    assert m.new_tokens == len(result.token_ids)
    assert m.target_forwards >= 1
    assert 0 <= m.accepted_nodes <= m.drafted_nodes
    assert m.tau == pytest.approx(m.new_tokens / m.target_forwards)
    assert sum(m.drafted_by_depth) == m.drafted_nodes
    assert sum(m.accepted_by_depth) == m.accepted_nodes
    assert all(a <= d for a, d in zip(m.accepted_by_depth, m.drafted_by_depth))
    # each forward commits its counted accepted nodes + 1 token; a stop inside the last block commits (and counts)
    # only the accepted nodes up to the stop, so that block may lack its recovered/bonus token, never more
    assert m.accepted_nodes + m.target_forwards - 1 <= m.new_tokens <= m.accepted_nodes + m.target_forwards
    if result.finish_reason == "length":
        assert m.new_tokens == m.accepted_nodes + m.target_forwards
    for pm in m.proposers.values():  # credited acceptance never counts a node after the stop
        assert pm.accepted_nodes <= m.accepted_nodes and sum(pm.accepted_by_depth) == pm.accepted_nodes
    assert result.finish_reason in ("stop", "length")
    # the engine turns a proposer's exception into a target-only step, so a test proposer's failed assertion
    # would otherwise go unnoticed
    assert m.proposer_faults == 0


def assert_user_error(result, *needles: str) -> str:
    """Exit code 2, one ``error:`` line on stderr containing every needle, empty stdout, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    return lines[0]


# --- a live server ----------------------------------------------------------------------------------------------------


def wait_healthy(url: str, tries: int, pause: float) -> bool:
    """Poll ``url``/health until it answers 200 (True), at most ``tries`` times ``pause`` seconds apart."""
    import time

    import httpx

    for _ in range(tries):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return True
        except httpx.HTTPError:
            time.sleep(pause)
    return False


def join_chat_stream(chunks) -> tuple[str, dict, list, str | None]:
    """Join an openai client's streamed chat chunks as a client does: ``(content, {index: {"name", "arguments"}},
    logprob entries, finish_reason)``."""
    content, calls, logprobs, finish = "", {}, [], None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            calls.setdefault(call.index, {"name": call.function.name, "arguments": ""})
            calls[call.index]["arguments"] += call.function.arguments or ""
        if choice.logprobs is not None and choice.logprobs.content:
            logprobs += choice.logprobs.content
        finish = choice.finish_reason or finish
    return content, calls, logprobs, finish


def live_server(app):
    """Serve ``app`` with uvicorn on a free localhost port in a thread: a context manager giving its URL once
    ``/health`` answers, stopped on exit."""
    import contextlib
    import socket
    import threading

    import uvicorn

    @contextlib.contextmanager
    def running():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=srv.run, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, tries=200, pause=0.05)
        try:
            yield url
        finally:
            srv.should_exit = True
            thread.join(timeout=10)

    return running()


# --- combining: drafts, step reports, scripted proposers --------------------------------------------------------------

COMBINING_N_NEW = 32


def chain(ids, probs=None) -> DraftTree:
    return DraftTree.chain(ids, probs)


def tree(ids, parents, probs=None) -> DraftTree:
    return DraftTree(torch.tensor([ids]), torch.tensor([parents]), None if probs is None else probs[None])


def step(name, drafted=0, accepted=0, asked=True, budget=8, proposed=None, depths=None, draft_s=0.001):
    proposed = drafted if proposed is None else proposed
    depths = tuple([1] * drafted) if depths is None else depths
    return ProposerStep(name, asked, budget if asked else 0, proposed, drafted, depths, accepted, accepted, draft_s,
                        False)


# --- combining: proposers for the engine tests ------------------------------------------------------------------------


class ScriptedTree(ProposerBase):
    """A deterministic tree: a wrong branch first, then ``good`` correct tokens of the reference under the second
    root child. On a target that cannot take trees it drafts the correct chain."""

    name = "scripted-tree"
    produces_trees = True

    def __init__(self, target, reference: list[int], good: int = 3) -> None:
        super().__init__(ProposerConfig(name=self.name), target)
        self.reference, self.good = reference, good

    def propose(self, state, budget):
        done = state.num_generated
        right = self.reference[done : done + self.good]
        if not right:
            return DraftTree.empty()
        if not self.target.supports_trees:
            return chain(right)
        wrong = [(t + 1) % VOCAB for t in right]
        ids = [wrong[0], right[0]] + right[1:] + wrong[1:2]
        parents = [-1, -1] + list(range(1, len(right))) + [0][: len(wrong[1:2])]
        return tree(ids, parents).truncate(budget)


class ScriptedChain(ProposerBase):
    """Drafts ``k`` tokens of the reference, the ones from ``correct`` on made wrong."""

    name = "scripted"

    def __init__(self, target, reference: list[int], k: int = 4, correct: int | None = None, name: str = "scripted"):
        super().__init__(ProposerConfig(name=name), target)
        self.name = name
        self.reference, self.k, self.correct = reference, k, correct

    def propose(self, state, budget):
        done = state.num_generated
        draft = self.reference[done : done + min(self.k, budget)]
        c = len(draft) if self.correct is None else self.correct
        return chain(draft[:c] + [(t + 1) % VOCAB for t in draft[c:]]) if draft else DraftTree.empty()


def draft_dir(root: Path, arch: str) -> Path:
    """A different tiny random model with the same vocabulary: an HF draft for the draft-model proposer."""
    folder = root / f"draft-{arch}"
    if not folder.exists():
        build_model(arch, seed=1).save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    return folder



def policy_of(name: str, max_nodes: int = 12):
    if name == "priority":
        return PriorityPolicy(PriorityConfig(max_nodes=max_nodes))
    return ConfidencePolicy(ConfidenceConfig(max_nodes=max_nodes))


# --- learned proposers' random weights --------------------------------------------------------------------------------


def random_heads(num_heads: int = 4, num_layers: int = 1, std: float = 0.3, seed: int = 0,
                 hidden: int = HIDDEN, token_map: torch.Tensor | None = None) -> MedusaHeads:
    """Heads with normal(std) weights and biases (zero-init heads would all predict what the LM head predicts)."""
    heads = MedusaHeads(hidden, num_heads, num_layers, token_map)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return heads


def random_drafter(model, seed: int = 1, subset: torch.Tensor | None = None, layers=None) -> EagleDrafter:
    spec = EagleSpec.for_target(model.config, NAME, layers)
    d = new_drafter(spec, torch.arange(VOCAB) if subset is None else subset, seed)
    init_from_target(d, model)
    return d


# --- a scripted successor target: known drafts ------------------------------------------------------------------------
SV = 64  # vocabulary = hidden size: every hidden state is a one-hot token


def successor() -> list[int]:
    """The fixed permutation ``succ`` a scripted target continues with: its greedy continuation of ``x`` is
    ``succ(x), succ(succ(x)), ...``."""
    perm = torch.randperm(SV, generator=torch.Generator().manual_seed(7)).tolist()
    succ = [0] * SV
    for i in range(SV):
        succ[perm[i]] = perm[(i + 1) % SV]
    return succ


def successor_chain(x: int, n: int) -> list[int]:
    """The ``n`` tokens a scripted target decodes after ``x``."""
    succ, out = successor(), []
    for _ in range(n):
        x = succ[x]
        out.append(x)
    return out


def run(target: Target, proposers, prompt=PROMPT, n: int = 24, sampling=SamplingParams(),
        seed: int = 0) -> GenerationResult:
    """The engine with ``proposers`` and the greedy verifier: ``n`` new tokens after ``prompt``."""
    return Engine(target, proposers, GreedyVerifier()).generate(prompt, max_new_tokens=n, sampling=sampling, seed=seed)


def drafts_seen(target: Target, proposer, prompt, steps: int = 1):
    """Each draft the proposer makes over 8 tokens after ``prompt`` (the engine's own prefill, so features are
    real), as (committed tokens, draft ids, draft parents), and the result."""
    seen = []
    orig = proposer.propose

    def spy(state, budget):
        tree = orig(state, budget)
        seen.append((state.tokens[0].tolist(), tree.token_ids[0].tolist(), tree.parent[0].tolist()))
        return tree

    proposer.propose = spy
    r = run(target, [proposer], prompt=prompt, n=8)
    return seen, r


def mtp(target: Target, **kw):
    from specframe_plugins.mtp import MtpConfig, MtpProposer

    return MtpProposer(MtpConfig(**kw), target.info)


# --- replay: what the replay tests record from ------------------------------------------------------------------------
REPLAY_N_NEW = 40
# a steep synthetic cost curve (T(n) ms at two contexts): routers trim drafts on it
REPLAY_CURVE = {128: [10.0, 11.0, 13.0, 17.0, 25.0, 41.0], 512: [12.0, 13.0, 15.0, 19.0, 27.0, 43.0]}
REPLAY_QUESTIONS = [(PROMPT, "summarization"), (PROMPT_2, "summarization"), (PROMPT[::-1], "qa"),
                    ([3, 7, 3, 7, 9, 3, 7, 3, 7, 11], "qa"), (PROMPT_2[::-1] + PROMPT, "rag"),
                    ([30, 31, 32, 30, 31], "rag")]


def text_of(ids: list[int]) -> str:
    return " ".join(WORDS[i] for i in ids)


REPLAY_PROMPTS = [Prompt(text_of(ids), i + 1, cat) for i, (ids, cat) in enumerate(REPLAY_QUESTIONS)]


def replay_target(arch: str, curve: bool) -> Target:
    """A tiny target named :data:`NAME`, with :data:`REPLAY_CURVE` as its measured cost when ``curve``."""
    t = Target(build_model(arch), build_tokenizer(), name=NAME)
    if curve:
        t.info = replace(t.info, cost=CostCurve(REPLAY_CURVE))
    return t


# the CLI's trace (``specframe trace record`` over two model folders), shared by the replay command's tests
CLI_TRACE_N_NEW = 24
CLI_TRACE_QUESTIONS = [(PROMPT, "summarization"), (PROMPT_2, "summarization"), (PROMPT[::-1], "qa"),
                       (PROMPT_2[::-1], "rag"), ([3, 7, 3, 7, 9, 3, 7, 3, 7, 11], "rag")]


def invoke(*args: str):
    """``specframe ARGS...`` through typer's test runner."""
    from typer.testing import CliRunner

    from specframe import cli

    return CliRunner().invoke(cli.app, list(args))


def write_cli_trace(root: Path) -> Path:
    """Into ``root``: model folders ``tiny-llama`` (the target) and ``tiny-qwen``, questions ``q.jsonl``, and a trace
    ``trace`` recorded from tiny-llama by ``specframe trace record`` (run with SPECFRAME_CACHE set)."""
    for name, arch in (("tiny-llama", "llama"), ("tiny-qwen", "qwen2")):
        build_model(arch).save_pretrained(root / name)
        build_tokenizer().save_pretrained(root / name)
    questions = root / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i + 1, "category": c, "turns": [text_of(p)]}) + "\n"
                                 for i, (p, c) in enumerate(CLI_TRACE_QUESTIONS)))
    result = invoke("trace", "record", "--questions", str(questions), "--output", str(root / "trace"), "--model",
                    str(root / "tiny-llama"), "--max-new-tokens", str(CLI_TRACE_N_NEW), "--no-profile",
                    "--threads", "1")
    assert result.exit_code == 0, result.output
    assert "5 questions of tiny-llama (float32)" in result.stderr
    return root


# --- the machine: a synthetic profile ---------------------------------------------------------------------------------

# bf16/2t is flat (native bf16): best for speculation; fp32/2t has the lowest T(1): best for plain decoding
PROFILE_ROWS = {
    Candidate("float32", 1, False): [18.0, 30.0, 50.0, 90.0, 170.0, 330.0],
    Candidate("float32", 2, False): [12.0, 20.0, 35.0, 60.0, 110.0, 200.0],
    Candidate("bfloat16", 1, False): [30.0, 31.0, 32.0, 33.0, 38.0, 45.0],
    Candidate("bfloat16", 2, False): [20.0, 20.5, 21.0, 22.0, 25.0, 30.0],
    Candidate("bfloat16", 2, True): [21.0, 21.5, 22.0, 23.0, 27.0, 33.0],
}


def make_profile(rows=None, key: str = "k" * 16, others_load: float = 0.0, contexts=(128, 512)) -> MachineProfile:
    """A machine profile of ``rows`` (default :data:`PROFILE_ROWS`) at each context, T(n) doubling per context."""
    rows = PROFILE_ROWS if rows is None else rows
    measured = [Measured(c, {ctx: [t * (1 + i) for t in row] for i, ctx in enumerate(contexts)})
                for c, row in rows.items()]
    return MachineProfile(key, "tiny", "cpu", {"cpu": "test", "cores": 2}, measured, others_load, 12.3)


# The 2-core Xeon of issue 67 (AVX-512 BF16, no AMX): the old rule gave plain decoding bf16/1t/packed (T(1) 44.9 ms,
# mean of the two contexts) and speculation bf16/2t (22.7 against 24.8 ms per token at the reference acceptance).
# Built from the figures, not measured; lab/data/machine-profiles/ holds the same medians with rounds.
XEON_ROWS = {  # candidate -> (T(n) at 128 cached tokens, at 512), n in NS
    Candidate("bfloat16", 1, False): ([45.0, 52.0, 54.0, 61.0, 78.0, 115.0, 200.0, 380.0],
                                      [50.0, 57.5, 60.0, 67.5, 86.0, 126.0, 215.0, 405.0]),
    Candidate("bfloat16", 2, False): ([47.0, 50.0, 51.0, 53.0, 63.0, 92.0, 150.0, 280.0],
                                      [52.0, 55.5, 56.5, 58.5, 69.0, 100.0, 162.0, 300.0]),
    Candidate("bfloat16", 1, True): ([42.5, 49.0, 51.5, 58.0, 74.0, 110.0, 190.0, 360.0],
                                     [47.3, 54.5, 57.0, 64.0, 81.0, 120.0, 205.0, 385.0]),
    Candidate("bfloat16", 2, True): ([46.0, 52.0, 53.5, 56.5, 67.0, 98.0, 160.0, 300.0],
                                     [51.0, 57.5, 59.0, 62.0, 73.0, 106.0, 172.0, 320.0]),
    Candidate("float32", 1, False): ([58.0, 80.0, 105.0, 150.0, 230.0, 420.0, 800.0, 1550.0],
                                     [64.0, 88.0, 114.0, 162.0, 248.0, 450.0, 850.0, 1650.0]),
    Candidate("float32", 2, False): ([50.0, 62.0, 80.0, 118.0, 190.0, 350.0, 660.0, 1280.0],
                                     [56.0, 69.0, 88.0, 128.0, 205.0, 375.0, 700.0, 1350.0]),
    Candidate("float32", 1, True): ([57.0, 78.0, 100.0, 142.0, 220.0, 400.0, 770.0, 1500.0],
                                    [63.0, 86.0, 109.0, 154.0, 238.0, 430.0, 820.0, 1600.0]),
    Candidate("float32", 2, True): ([51.0, 63.0, 79.0, 115.0, 185.0, 340.0, 640.0, 1240.0],
                                    [57.0, 70.0, 87.0, 125.0, 200.0, 365.0, 680.0, 1320.0]),
}


def xeon_profile(factors=None) -> MachineProfile:
    """The :data:`XEON_ROWS` profile. ``factors``: label -> one factor per round (each candidate's rows times its
    factors: the rounds; the medians are the rows only where each list's median is 1.0; a label not given gets
    ``factors["other"]``); None: one round (no rounds kept, as a version-1 file)."""
    measured = []
    for c, rows in XEON_ROWS.items():
        if factors is None:
            measured.append(Measured(c, {128: list(rows[0]), 512: list(rows[1])}))
            continue
        fs = factors.get(c.label, factors["other"])
        measured.append(Measured.of_rounds(c, {ctx: [[t * f for t in row] for f in fs]
                                               for ctx, row in zip((128, 512), rows)}))
    return MachineProfile("x" * 16, "tiny", "cpu", {"cpu": "xeon", "cores": 2}, measured, 0.0, 60.0,
                          rounds=1 if factors is None else len(next(iter(factors.values()))))


# --- proposers for testing the conformance kit ------------------------------------------------------------------------
# Honest ones it must pass, and ones with a single, realistic bug it must catch (each docstring says which check
# should fail).


class SelfDraftConfig(ProposerConfig):
    name: Literal["selfdraft"] = "selfdraft"
    k: int = Field(2, ge=1, description="Draft length.")
    sharpen: float = Field(1.0, gt=0, description="Sample from q ** (1 / sharpen), normalised; 1 = honest.")


class SelfDraft(ProposerBase):
    """Samples drafts from the target itself (no cache) and reports q = the target's warped distribution.

    With ``sharpen != 1`` it samples from a sharpened q but still reports q: the exactness bug of must-show c
    (caught by ``check_draft_probs_match_samples`` and ``check_sampling_lossless``, invisible to greedy).
    """

    name = "selfdraft"
    Config = SelfDraftConfig
    provides_draft_probs = True

    def _logits(self, tokens: list[int]) -> torch.Tensor:
        return self.target.model(input_ids=torch.tensor([tokens], device=self.target.device)).logits[0, -1]

    def propose(self, state, budget):
        tokens, ids, qs = state.tokens[0].tolist(), [], []
        for _ in range(min(self.config.k, budget)):
            logits = self._logits(tokens + ids)
            if state.sampling.is_greedy:
                ids.append(int(logits.argmax()))
                continue
            q = probs_from_logits(logits, state.sampling)
            sample_from = torch.softmax(torch.log(q) / self.config.sharpen, -1)
            ids.append(int(torch.multinomial(sample_from, 1, generator=state.generator)))
            qs.append(q)
        return DraftTree.chain(ids, torch.stack(qs) if qs else None)


class OtherModelConfig(ProposerConfig):
    name: Literal["othermodel"] = "othermodel"
    k: int = Field(2, ge=1, description="Draft length.")
    sample_temperature: float = Field(0.7, gt=0, description="Temperature actually sampled at (bug if != target's).")


class OtherModelDraft(SelfDraft):
    """A separate draft model (another tiny random Llama) that samples at ``sample_temperature`` but reports the
    distribution at the request's temperature: q differs from p, so the end-to-end bias is diluted, and the direct
    draft-probability check is what catches it."""

    name = "othermodel"
    Config = OtherModelConfig

    def __init__(self, config, target) -> None:
        super().__init__(config, target)
        self.draft_model = tiny_target(seed=1, device=target.device).model

    def propose(self, state, budget):
        tokens, ids, qs = state.tokens[0].tolist(), [], []
        for _ in range(min(self.config.k, budget)):
            logits = self.draft_model(input_ids=torch.tensor([tokens + ids], device=self.target.device)).logits[0, -1]
            q = probs_from_logits(logits, state.sampling)
            sampled = torch.softmax(logits / self.config.sample_temperature, -1)
            ids.append(int(torch.multinomial(sampled, 1, generator=state.generator)))
            qs.append(q)
        return DraftTree.chain(ids, torch.stack(qs))


class DropUnlikely(SelfDraft):
    """Honest sampling, but drops the last draft node when the sampled token had q < 0.3 ("low confidence").
    Deciding *after* seeing the token biases the drafts that remain: caught by the draft-probability check."""

    name = "dropunlikely"

    class Config(SelfDraftConfig):
        name: Literal["dropunlikely"] = "dropunlikely"

    def propose(self, state, budget):
        draft = super().propose(state, budget)
        n = draft.num_nodes
        if n and draft.draft_probs is not None and float(draft.draft_probs[0, n - 1, draft.token_ids[0, n - 1]]) < 0.3:
            return draft.truncate(n - 1)
        return draft


class LeakyDraftModelConfig(ProposerConfig):
    name: Literal["leaky"] = "leaky"


class LeakyDraftModel(SelfDraft):
    """A greedy draft model keeping its own context (standing in for a draft KV cache): it appends its drafts,
    and on feedback appends only the last committed token, as if every draft had been accepted. Output stays
    exact (the verifier guards it), but after a rejection the drafts come from a wrong context. Caught by the
    rollback check."""

    name = "leaky"
    Config = LeakyDraftModelConfig

    def start(self, state):
        self.context = state.tokens[0].tolist()

    def propose(self, state, budget):
        draft = []
        for _ in range(min(3, budget)):
            draft.append(int(self._logits(self.context + draft).argmax()))
        self.context += draft
        return DraftTree.chain(draft)

    def on_verified(self, outcome):
        self.context.append(outcome.committed[0][-1])  # bug: the rejected drafts are never cropped


class GlobalRngConfig(ProposerConfig):
    name: Literal["globalrng"] = "globalrng"


class GlobalRng(SelfDraft):
    """Samples with the global torch RNG instead of ``state.generator``: caught by the determinism check."""

    name = "globalrng"
    Config = GlobalRngConfig

    def propose(self, state, budget):
        if state.sampling.is_greedy:
            return DraftTree.empty()
        q = probs_from_logits(self._logits(state.tokens[0].tolist()), state.sampling)
        return DraftTree.chain([int(torch.multinomial(q, 1))], q[None])


class MutatorConfig(ProposerConfig):
    name: Literal["mutator"] = "mutator"


class Mutator(ProposerBase):
    """Writes into ``state.tokens`` (the engine's committed tokens): caught by the contract check."""

    name = "mutator"
    Config = MutatorConfig

    def propose(self, state, budget):
        state.tokens[0, -1] = 0
        return DraftTree.empty()


class UndeclaredProbsConfig(ProposerConfig):
    name: Literal["undeclared"] = "undeclared"


class UndeclaredProbs(ProposerBase):
    """Returns draft_probs while declaring ``provides_draft_probs = False``: caught by the contract check."""

    name = "undeclared"
    Config = UndeclaredProbsConfig

    def propose(self, state, budget):
        v = self.target.vocab_size
        return DraftTree.chain([1], torch.full((1, v), 1.0 / v, device=self.target.device))


class BadFeedbackConfig(ProposerConfig):
    name: Literal["badfeedback"] = "badfeedback"


class BadFeedback(ProposerBase):
    """Adapts its draft length from feedback but reads a field that does not exist: caught by the feedback check."""

    name = "badfeedback"
    Config = BadFeedbackConfig

    def propose(self, state, budget):
        return DraftTree.empty()

    def on_verified(self, outcome):
        self.k = outcome.num_accepted + outcome.num_rejected  # AttributeError: there is no num_rejected


class ConstraintCommitterConfig(SelfDraftConfig):
    name: Literal["constraintcommitter"] = "constraintcommitter"


class ConstraintCommitter(SelfDraft):
    """Honest drafts, but it advances the request's constraint itself (``state.constraint.commit``) after drafting,
    as an author might who thinks the proposer keeps the grammar state: the engine's grammar state runs ahead of the
    committed tokens. The proposer sees a read-only view, so its commit raises (isolated: output unchanged) and
    ``check_constrained_greedy_lossless`` reports it; invisible without a constraint."""

    name = "constraintcommitter"
    Config = ConstraintCommitterConfig

    def propose(self, state, budget):
        draft = super().propose(state, budget)
        if state.constraint is not None and draft.num_nodes:
            state.constraint.commit(draft.token_ids[0, :1].tolist())
        return draft


# --- plugin distributions ---------------------------------------------------------------------------------------------


def proposer_module(name: str, cls_name: str = "P", body: str = "") -> str:
    """Source of a plugin module registering one trivial proposer called ``name``."""
    return f'''
        from typing import Literal
        from specframe import DraftTree, ProposerBase, ProposerConfig, hookimpl

        class Config(ProposerConfig):
            name: Literal["{name}"] = "{name}"

        class {cls_name}(ProposerBase):
            """A test proposer."""
            name = "{name}"
            Config = Config

            def propose(self, state, budget):
                {body or "return DraftTree.empty()"}

        @hookimpl
        def specframe_register_proposers(register):
            register({cls_name})
    '''
