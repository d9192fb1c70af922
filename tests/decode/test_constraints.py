"""Structured output under speculation (issue 54): a constraint masks every draft row by the grammar state along its
path, so greedy output equals constrained decoding without speculation — checked against a reference outside
specframe: transformers' ``generate`` with a logits processor that masks by llguidance directly.

The model is a tiny random llama over a byte-level BPE tokenizer trained on JSON-like text (so the grammar engine
sees real byte tokens; :func:`tests.fakes.build_bpe_tokenizer`), float32, CPU.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerFast

import specframe
from specframe.contracts import DraftTree
from specframe.contracts.constraint import ConstraintSpec
from specframe.errors import ConstraintError
from specframe.grammar.llguidance_engine import LLGuidanceEngine, unpack_bitmask
from specframe.target.hf import Target

from tests.fakes import BPE_EOS as EOS
from tests.fakes import build_bpe_model, build_bpe_tokenizer

pytestmark = pytest.mark.device_subset

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
SPECS = {
    "json_schema": {"json_schema": PERSON},
    "json_object": {"json_object": True},
    "regex": {"regex": r"[a-z]{2,6}-[0-9]{1,4}( [a-z]{1,8})?"},
    "grammar": {"grammar": 'start: "[" item ("," item)* "]"\nitem: /[0-9]{1,3}/ | "true" | "false"'},
}


@pytest.fixture(scope="module")
def bpe_tokenizer() -> PreTrainedTokenizerFast:
    return build_bpe_tokenizer()


@pytest.fixture(scope="module")
def bpe_model(bpe_tokenizer):
    return build_bpe_model(bpe_tokenizer)


class LLGuidanceProcessor(LogitsProcessor):
    """The reference: constrained decoding one token at a time, through llguidance's own matcher and bitmask (no
    specframe code but the grammar text, which is llguidance's ``grammar_from_*`` output)."""

    def __init__(self, llg_tokenizer, grammar: str, prompt_len: int, vocab: int) -> None:
        import llguidance
        import llguidance.torch

        self.matcher = llguidance.LLMatcher(llg_tokenizer, grammar, log_level=0)
        self.fill = llguidance.torch.fill_next_token_bitmask
        self.prompt_len, self.vocab = prompt_len, vocab

    def __call__(self, input_ids, scores):
        generated = input_ids[0, self.prompt_len:].tolist()
        if generated:
            assert self.matcher.consume_token(generated[-1])
        bitmask = torch.zeros((1, (self.vocab + 31) // 32), dtype=torch.int32)
        self.fill(self.matcher, bitmask, 0)
        bits = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).reshape(1, -1)[:, :self.vocab]
        return scores.masked_fill(bits.to(scores.device) == 0, float("-inf"))


def reference(model, engine: LLGuidanceEngine, spec: dict, prompt: list[int], max_new: int) -> list[int]:
    grammar = engine.grammar(ConstraintSpec.model_validate(spec))
    proc = LLGuidanceProcessor(engine.tokenizer, grammar, len(prompt), model.config.vocab_size)
    out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=max_new, do_sample=False,
                         logits_processor=LogitsProcessorList([proc]), eos_token_id=EOS, pad_token_id=EOS)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def sf(bpe_model, bpe_tokenizer):
    return specframe.load(target=Target(bpe_model, bpe_tokenizer), chat=False, max_new_tokens=48)


def _prompt(tok, text: str) -> list[int]:
    return tok.encode(text)


@pytest.mark.parametrize("kind", sorted(SPECS))
@pytest.mark.parametrize("proposers", ["none", "ngram", "lookahead", "grammar", "grammar+ngram", "grammar/forced",
                                       "grammar/forced+ngram"])
def test_greedy_equals_constrained_decoding(sf, bpe_model, bpe_tokenizer, kind, proposers):
    spec = SPECS[kind]
    engine = sf._constraint_engine or LLGuidanceEngine(bpe_tokenizer, bpe_model.config.vocab_size, {EOS})
    names = proposers.split("+")
    entries = [{"name": "grammar", "branch": 0} if n == "grammar/forced" else {"name": n} for n in names]
    for text in ('{"name": "Ada", "age": 36, "tags": ["x"]} {"name": "Ada", "age"', "abc-123 xyz_9 abc-1",
                 "[1, 2, 3] [1, 2"):
        prompt = _prompt(bpe_tokenizer, text)
        want = reference(bpe_model, engine, spec, prompt, 48)
        res = sf.generate_result(prompt, proposers=entries, constraint=spec,
                                 **({"merge": "priority"} if len(names) > 1 else {}))
        assert res.token_ids == want, (kind, proposers, text)
        body = bpe_tokenizer.decode([t for t in res.token_ids if t != EOS])
        if res.finish_reason == "stop" and kind in ("json_schema", "json_object"):
            jsonschema.validate(json.loads(body), spec.get("json_schema", {"type": "object"}))


def test_constrained_drafts_are_accepted(sf, bpe_tokenizer):
    """The drafts the grammar forces are verified and accepted: τ > 1 under the grammar proposer alone."""
    prompt = _prompt(bpe_tokenizer, "abc")
    res = sf.generate_result(prompt, proposers="grammar", constraint={"json_schema": PERSON})
    m = res.metrics.to_dict()
    assert m["accepted_tokens"] > 0 and m["tau"] > 1.0


def test_nearly_forced_tokens_branch(sf, bpe_model, bpe_tokenizer):
    """Where the grammar allows a few tokens after its forced run, the grammar proposer drafts a tree: a branch per
    allowed token (each with what the grammar then forces), and the target's choice among them is accepted."""
    from specframe.contracts.constraint import ConstraintView
    from specframe.contracts.proposer import DecodeState
    from specframe.sampling import SamplingParams
    from specframe_plugins.forced_tokens import GrammarConfig, GrammarProposer

    grammar = 'start: "[" ("true" | "false") "]"'
    engine = LLGuidanceEngine(bpe_tokenizer, bpe_model.config.vocab_size, {EOS})
    c = engine.compile(ConstraintSpec(grammar=grammar))
    prompt = _prompt(bpe_tokenizer, "abc")
    gen = torch.Generator(device=bpe_model.device)  # as the engine's: on the target's device
    state = DecodeState(torch.tensor([prompt]), len(prompt), SamplingParams(), gen)
    state.constraint = ConstraintView(c)
    target = Target(bpe_model, bpe_tokenizer)
    draft = GrammarProposer(GrammarConfig(branch=4), target.info).propose(state, 16)
    tokens, parents = draft.token_ids[0].tolist(), draft.parent[0].tolist()
    leaves = []
    for i in set(range(len(tokens))) - set(parents):  # the text along each leaf's path
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        leaves.append(bpe_tokenizer.decode(path[::-1]))
    assert sorted(leaves) == ["[false]", "[true]"], leaves  # the forced "[", both branches, each closed
    assert c.forced(4) == tokens[:1] == c.choices(1)  # the state is as it was: only "[" allowed
    res = sf.generate_result(prompt, proposers=[{"name": "grammar", "branch": 4}], constraint={"grammar": grammar})
    assert bpe_tokenizer.decode([t for t in res.token_ids if t != EOS]) in ("[true]", "[false]")
    assert res.metrics.target_forwards <= 2  # the whole answer in one draft (and EOS after it)


def test_sampling_is_constrained(sf, bpe_tokenizer):
    """Under sampling every output still matches the regex (the masked distribution is what is sampled)."""
    import re

    pattern = SPECS["regex"]["regex"]
    for seed in range(6):
        res = sf.generate_result(_prompt(bpe_tokenizer, "abc-1"), proposers="ngram", constraint=SPECS["regex"],
                                 temperature=1.0, seed=seed)
        text = bpe_tokenizer.decode([t for t in res.token_ids if t != EOS])
        assert res.finish_reason == "stop" and re.fullmatch(pattern, text), text


def test_forbidden_drafts_are_cut_before_verification(sf, bpe_model, bpe_tokenizer):
    engine = LLGuidanceEngine(bpe_tokenizer, bpe_model.config.vocab_size, {EOS})
    c = engine.compile(ConstraintSpec(regex="ab+c"))
    a, b, cc, x = (bpe_tokenizer.convert_tokens_to_ids(t) for t in "abcx")
    assert c.allowed_prefix(DraftTree.chain([a, b, b, cc, x])) == 4  # x after the match: forbidden (EOS only)
    assert c.allowed_prefix(DraftTree.chain([b, a])) == 0
    tree = DraftTree.from_lists([a, x, b, cc], [-1, 0, 0, 2])  # a -> (x | b -> c): x's subtree is cut
    assert c.allowed_prefix(tree) == 1
    logits = torch.zeros((1, 5, bpe_model.config.vocab_size), device=bpe_model.device)
    masked = c.mask(tree, logits)
    allowed = torch.isfinite(masked[0])
    texts = [bpe_tokenizer.convert_ids_to_tokens(t) for t in range(logits.shape[-1])]

    def ok(row: int) -> set[str]:
        return {texts[t] for t in allowed[row].nonzero().flatten().tolist()}

    import re

    assert ok(0) == {t for t in texts if re.fullmatch("ab*c?|ab+c", t)} and "a" in ok(0)  # row 0: "" so far
    assert "b" in ok(1) and "a" not in ok(1) and "<eos>" not in ok(1)  # after "a"
    assert allowed[2].all()  # after the forbidden x: unreachable, left as it is
    assert ok(4) == {"<eos>"}  # after "abc": the regex is complete, only EOS
    c.commit([a, b])
    assert c.allowed_prefix(DraftTree.chain([b, cc])) == 2


def test_unpack_bitmask():
    mask = torch.tensor([[0b101, -1], [0, -(1 << 31)]], dtype=torch.int32)
    got = unpack_bitmask(mask, 40)
    assert got[0].nonzero().flatten().tolist() == [0, 2, *range(32, 40)]
    assert got[1].nonzero().flatten().tolist() == []  # (bit 31 of word 1 is token 63, past the vocabulary)
    assert unpack_bitmask(mask, 64)[1].nonzero().flatten().tolist() == [63]


@pytest.mark.parametrize("spec, message", [
    ({"regex": "a(b"}, "invalid regex"),
    ({"grammar": "start: foo"}, "invalid grammar"),
    ({"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}}, "invalid json_schema"),
    ({"json_schema": {"type": "string", "format": "weird"}}, "invalid json_schema: Unknown format"),
    ({"regex": "a", "grammar": "start: \"a\""}, "exactly one of"),
    ({}, "exactly one of"),
    ({"json_schema": "{not json"}, "not valid JSON"),
])
def test_bad_constraints_are_one_line(sf, bpe_tokenizer, spec, message):
    with pytest.raises(ConstraintError) as err:
        sf.generate_result(_prompt(bpe_tokenizer, "abc"), constraint=spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_batched_equals_alone(sf, bpe_tokenizer):
    prompts = [_prompt(bpe_tokenizer, t) for t in ("abc-123 xyz", '{"name": "A', "[1, 2", "true")]
    spec = SPECS["json_object"]
    alone = [sf.generate_result(p, proposers="ngram", constraint=spec).token_ids for p in prompts]
    batched = [r.token_ids for r in sf.generate_batch_results(prompts, batch_size=4, proposers="ngram",
                                                              constraint=spec)]
    assert batched == alone


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_walks_leave_the_state_as_it_was(bpe_model, bpe_tokenizer, kind):
    """Random trees (tokens that complete the output and EOS included): every mask row equals a fresh matcher's after
    that row's path, and after each walk the state equals a fresh matcher's after the committed tokens."""
    import random

    vocab = bpe_model.config.vocab_size
    engine = LLGuidanceEngine(bpe_tokenizer, vocab, {EOS})
    spec = ConstraintSpec.model_validate(SPECS[kind])
    text = {"json_schema": '{"name": "Ada", "age": 36, "tags": ["x"]}', "json_object": '{"a": {"b": null}}',
            "regex": "abc-123 xyz", "grammar": "[1,2,true]"}[kind]
    good = bpe_tokenizer.encode(text)
    pool = sorted(set(good)) + [EOS]
    empty = DraftTree.empty()

    def state(c) -> torch.Tensor:
        return torch.isfinite(c.mask(empty, torch.zeros(1, 1, vocab))[0, 0])

    rng = random.Random(kind)
    for _ in range(60):
        cut = rng.randint(0, len(good))
        c = engine.compile(spec)
        c.commit(good[:cut])
        before = state(c)
        n = rng.randint(1, 8)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        tokens = [good[cut] if cut < len(good) and rng.random() < 0.4 else rng.choice(pool) for _ in range(n)]
        tree = DraftTree.from_lists(tokens, parents)
        masked = torch.isfinite(c.mask(tree, torch.zeros(1, n + 1, vocab))[0])
        c.allowed_prefix(tree)
        assert torch.equal(state(c), before)
        for row in range(1, n + 1):
            path, node = [], row - 1
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            path = path[::-1]
            fresh = engine.compile(spec)
            fresh.commit(good[:cut])
            if EOS in path or fresh.matcher.validate_tokens(path) != len(path):
                assert masked[row].all()  # unreachable: left as it is
                continue
            fresh.commit(path)
            assert torch.equal(masked[row], state(fresh)), (tokens, parents, row)


@pytest.mark.parametrize("proposers", ["ngram", "lookahead", "grammar+ngram"])
def test_logprobs_equal_those_of_one_forward(sf, bpe_model, bpe_tokenizer, proposers):
    """Each token's log-probability (raw logits, before the mask) and its top 5, from the verification rows, equal
    those of one transformers forward over prompt + output (float32, 1e-4), with and without a constraint."""
    prompt = _prompt(bpe_tokenizer, '{"name": "Ada", "age": 36, "tags": ["x"]} {"name": "Ada"')
    names = proposers.split("+")
    for spec in (None, SPECS["json_object"]):
        res = sf.generate_result(prompt, proposers=[{"name": n} for n in names], constraint=spec, logprobs=5,
                                 **({"merge": "priority"} if len(names) > 1 else {}))
        assert res.logprobs is not None and len(res.logprobs) == len(res.token_ids)
        with torch.no_grad():
            ids = torch.tensor([prompt + res.token_ids], device=bpe_model.device)
            logits = bpe_model(ids).logits[0, len(prompt) - 1:-1]
        want = torch.log_softmax(logits.float(), -1)
        for j, item in enumerate(res.logprobs):
            assert item.token_id == res.token_ids[j]
            assert abs(item.logprob - float(want[j, item.token_id])) < 1e-4
            top_v, top_i = want[j].topk(5)
            assert [t for t, _ in item.top] == top_i.tolist()
            assert max(abs(v - float(w)) for (_, v), w in zip(item.top, top_v)) < 1e-4
    assert sf.generate_result(prompt, proposers="ngram").logprobs is None


def test_bad_logprobs_is_one_line(sf, bpe_tokenizer):
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(specframe.errors.ConfigError, match="logprobs must be an integer"):
            sf.generate_result(_prompt(bpe_tokenizer, "abc"), logprobs=bad)


class _SampledDraft:
    """A stochastic proposer for the sampling check: drafts 3 tokens drawn from a fixed q (mass on tokens the
    constraint forbids too), with their draft_probs: such nodes are never cut and must be rejected by the masked
    acceptance rule."""

    name = "sampled-draft"
    produces_trees = False
    provides_draft_probs = True
    needs_hidden_states = False
    reads_target_tokens = False
    feature_layers: tuple[int, ...] = ()

    def __init__(self, q: torch.Tensor) -> None:
        self.q = q

    def start(self, state) -> None:
        pass

    def propose(self, state, budget):
        k = min(3, budget)
        toks = torch.multinomial(self.q, k, replacement=True, generator=state.generator)
        return DraftTree.chain(toks.tolist(), self.q.expand(k, -1).clone())

    def on_verified(self, outcome) -> None:
        pass


@pytest.mark.parametrize("proposer", ["ngram", "sampled"])
def test_sampling_keeps_the_constrained_distribution(bpe_model, bpe_tokenizer, proposer):
    """The kit's statistical check under a constraint: the first two generated tokens follow the exact joint of
    constrained sampling (softmax of the masked logits at temperature 1), with deterministic (ngram) and sampled
    drafts alike."""
    from specframe.acceptance import SpeculativeSamplingVerifier
    from specframe.decode.engine import Engine
    from specframe.sampling import SamplingParams
    from specframe.testing.stats import tv_test_fixed
    from specframe_plugins.ngram import NgramConfig, NgramProposer

    target = Target(bpe_model, bpe_tokenizer)
    engine_llg = LLGuidanceEngine(bpe_tokenizer, bpe_model.config.vocab_size, {EOS})
    spec = ConstraintSpec(regex="[a-c]{1,3}-[0-9]")
    prompt = _prompt(bpe_tokenizer, "abc-1 ab-2 abc-1 a")
    vocab = bpe_model.config.vocab_size

    def masked_probs(prefix: list[int], committed: list[int]) -> torch.Tensor:
        c = engine_llg.compile(spec)
        c.commit(committed)
        with torch.no_grad():
            logits = bpe_model(torch.tensor([prefix + committed], device=bpe_model.device)).logits[:, -1:]
        return torch.softmax(c.mask(DraftTree.empty(), logits)[0, 0].double(), -1).cpu()

    first = masked_probs(prompt, [])
    exact = torch.zeros(vocab, vocab, dtype=torch.float64)
    for t in first.nonzero().flatten().tolist():
        exact[t] = first[t] * masked_probs(prompt, [t])
    if proposer == "ngram":
        make = lambda: NgramProposer(NgramConfig(k=4), target.info)  # noqa: E731
    else:
        q = torch.zeros(vocab, device=bpe_model.device)  # sampled with the engine's generator, on the device
        q[[bpe_tokenizer.convert_tokens_to_ids(t) for t in ("a", "b", "c", "x", "-", "1")]] = 1 / 6
        make = lambda: _SampledDraft(q)  # noqa: E731
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    n = 1500
    engine = Engine(target, [make()], SpeculativeSamplingVerifier())
    for seed in range(n):
        out = engine.generate(prompt, max_new_tokens=2, sampling=SamplingParams(temperature=1.0), seed=seed,
                              constraint=engine_llg.compile(spec)).token_ids
        counts[out[0], out[1]] += 1
    test = tv_test_fixed(counts, exact, seed=1)
    assert test.passed, test.summary()


def test_an_answer_longer_than_max_tokens_is_a_valid_prefix(sf, bpe_tokenizer):
    res = sf.generate_result(_prompt(bpe_tokenizer, "abc"), proposers="grammar", constraint={"regex": "xyz_9" * 20},
                             max_new_tokens=6)
    assert res.finish_reason == "length" and len(res.token_ids) == 6
    assert ("xyz_9" * 20).startswith(bpe_tokenizer.decode(res.token_ids))
    assert res.metrics.to_dict()["accepted_nodes"] > 0  # the forced text was drafted and accepted
