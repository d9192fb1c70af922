"""A request's decode options spelled once (issue 70): ``DecodeOptions`` is what ``Engine.request`` takes, what a
``BatchRequest`` holds and what the face's ``RequestOptions`` carries down, so a field given at the door reaches the
engine's ``Request`` unchanged on every host; the keyword form of ``Engine.request`` is the same request; the
sampling a lease's verifier was chosen for is the request's when it names none (given once)."""

from __future__ import annotations

import pytest

import specframe
from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier
from specframe.decode import engine as engine_module
from specframe.decode.batch import BatchRequest, decode_batch
from specframe.decode.engine import Engine
from specframe.decode.options import DecodeOptions
from specframe.registry import build_registry
from specframe.sampling import SamplingParams
from specframe.target.hf import Target
from specframe_plugins.ngram import NgramConfig, NgramProposer

from tests.fakes import PROMPT, build_bpe_model, build_bpe_tokenizer, build_model, build_tokenizer

SP = SamplingParams(temperature=0.8, top_p=0.9)


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(build_model("llama"), build_tokenizer())


def _engine(target: Target, verifier=None, sampling=None) -> Engine:
    return Engine(target, [NgramProposer(NgramConfig(name="ngram"), target.info)], verifier or GreedyVerifier(),
                  sampling=sampling)


def test_the_options_form_is_the_keyword_form(target):
    kw = dict(max_new_tokens=12, seed=3, logprobs=2)
    want = _engine(target).generate(PROMPT, **kw)
    got = _engine(target).generate(PROMPT, DecodeOptions(**kw))
    assert (got.token_ids, got.text, got.finish_reason, got.logprobs) == (
        want.token_ids, want.text, want.finish_reason, want.logprobs)
    with pytest.raises(TypeError, match="not both"):
        _engine(target).request(PROMPT, DecodeOptions(4), seed=1)
    with pytest.raises(TypeError, match="max_new_tokens"):
        _engine(target).request(PROMPT)


def test_sampling_is_given_once_to_the_engine(target):
    """An engine made for ``SP`` (its verifier chosen for it) decodes a request that names no sampling with ``SP``."""
    twice = _engine(target, SpeculativeSamplingVerifier(), SP).generate(PROMPT, DecodeOptions(16, SP, seed=5))
    once = _engine(target, SpeculativeSamplingVerifier(), SP).generate(PROMPT, DecodeOptions(16, seed=5))
    assert once.token_ids == twice.token_ids
    greedy = _engine(target).generate(PROMPT, max_new_tokens=16)  # no sampling anywhere: greedy, as before
    assert greedy.token_ids == _engine(target).generate(PROMPT, max_new_tokens=16, sampling=SamplingParams()).token_ids


def test_a_batch_request_holds_the_options(target):
    opts = DecodeOptions(10, SP, seed=2)
    new = BatchRequest(_engine(target, SpeculativeSamplingVerifier()), PROMPT, opts)
    old = BatchRequest(_engine(target, SpeculativeSamplingVerifier()), PROMPT, 10, SP, seed=2)
    assert new.options == old.options == opts
    got = dict(decode_batch(target, [new, old], 2))
    assert got[0].token_ids == got[1].token_ids
    with pytest.raises(TypeError, match="not both"):
        BatchRequest(_engine(target), PROMPT, opts, seed=1)


def test_each_option_given_at_the_door_reaches_the_engine(monkeypatch):
    """Every field of DecodeOptions, given to the face, arrives in the engine's Request as given (one hand-off: the
    face's RequestOptions.decode), on the thread host and the batch host alike."""
    seen: list[DecodeOptions] = []
    real = engine_module.Request.__init__

    def spy(self, engine, prompt_ids, options, **hooks):
        seen.append(options)
        real(self, engine, prompt_ids, options, **hooks)

    monkeypatch.setattr(engine_module.Request, "__init__", spy)
    tok = build_bpe_tokenizer()  # (a constraint needs a model with an EOS token)
    sf = specframe.load(target=Target(build_bpe_model(tok), tok), registry=build_registry(), proposers=["ngram"],
                        chat=False)
    try:
        def on_text(s: str) -> None:
            return None

        keywords = dict(max_new_tokens=7, temperature=0.5, top_p=0.9, seed=11, stop=["zz"], logprobs=1,
                        constraint={"regex": "[a-z ]+"})
        prompt = tok.encode("the answer is")
        sf.generate_result(prompt, on_text=on_text, **keywords)
        sf.generate_batch_results([prompt], **keywords)
    finally:
        sf.close()
    assert len(seen) == 2
    for got in seen:
        assert (got.max_new_tokens, got.seed, got.stop, got.logprobs) == (7, 11, ("zz",), 1)
        assert got.sampling == SamplingParams(temperature=0.5, top_p=0.9)
        assert got.constraint is not None  # compiled for the request
    assert seen[0].on_text is on_text


def test_the_old_constructors_warn_and_work(target):
    """RequestJob(sf, ...), PluginSets(sf) and RequestOptions(max_new_tokens=...) keep working for a release, with a
    DeprecationWarning naming the new spelling."""
    from specframe.instance_pool import PluginSets
    from specframe.request_job import RequestJob
    from specframe.request_options import RequestOptions

    sf = specframe.load(target=target, registry=build_registry(), proposers=["ngram"])
    try:
        with pytest.warns(DeprecationWarning, match="DecodeOptions"):
            opts = RequestOptions(max_new_tokens=6, sampling=SamplingParams(), seed=0, stop=())
        assert opts.decode == DecodeOptions(6, SamplingParams()) and opts.max_new_tokens == 6
        with pytest.warns(DeprecationWarning, match="RequestJob\\(ids, opts"):
            job = RequestJob(sf, list(PROMPT), opts)
        assert job.run().token_ids == sf.generate_result(list(PROMPT), max_new_tokens=6).token_ids
        with pytest.warns(DeprecationWarning, match="PluginSets\\(sf.config"):
            sets = PluginSets(sf)
        sets.lease().release()
    finally:
        sf.close()
