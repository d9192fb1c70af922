"""One ``Specframe`` used from several threads: each request's output and metrics are what it gives alone.

Before per-request instances, two threads running ``draft-model`` at temperature 0.8 shared one proposer object:
the outputs differed from the same requests run one after the other, and the draft reported faults ("cannot roll
the KV cache forward ...").
"""

from __future__ import annotations

import threading

import pytest

import specframe
from specframe.registry import build_registry
from specframe.target.hf import Target

from tests.fakes import PROMPT, PROMPT_2, WORDS, build_model, build_tokenizer

TIMINGS = {"wall_s", "prefill_s", "ttft_s", "queue_s", "propose_s", "forward_s", "verify_s", "other_s", "tokens_per_s", "draft_s"}


def without_timings(d):
    if isinstance(d, dict):
        return {k: without_timings(v) for k, v in d.items() if k not in TIMINGS}
    return d


@pytest.fixture(scope="module")
def sf_and_draft(tmp_path_factory):
    folder = tmp_path_factory.mktemp("threads-draft")
    build_model("llama", seed=1).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    sf = specframe.load(target=Target(build_model("llama"), build_tokenizer()), registry=build_registry())
    return sf, str(folder)


def requests(draft: str) -> list[dict]:
    """12 requests with mixed proposers (the issue's: draft-model at temperature 0.8, seed 5), modes and prompts."""
    dm = {"name": "draft-model", "model": draft}
    kinds = [
        dict(proposers=[dm], temperature=0.8, seed=5),
        dict(proposers=[dm], temperature=0.0),
        dict(proposers=["ngram"], temperature=0.0),
        dict(proposers=[{"name": "ngram", "branches": 3}], temperature=0.7, seed=2),
        dict(proposers=["ngram", dm], temperature=0.8, seed=9),  # combined: the router decides from counts here
        dict(proposers=["none"], temperature=1.0, seed=1),
    ]
    out = []
    for i in range(12):
        kw = dict(kinds[i % len(kinds)])
        prompt = PROMPT if i % 2 == 0 else PROMPT_2
        if i % 3 == 0:  # text: the tokenizer is shared too
            prompt = " ".join(WORDS[t] for t in prompt)
        kw.update(prompt=prompt, max_new_tokens=24 + i, stop=["hh"] if i % 5 == 4 else None)
        out.append(kw)
    return out


def run(sf, request: dict) -> dict:
    kw = dict(request)
    prompt = kw.pop("prompt")
    pieces: list[str] = []
    rec = sf.generate(prompt, on_text=pieces.append, **kw)
    rec["streamed"] = "".join(pieces)
    return without_timings(rec)


def test_four_threads_three_requests_each_equal_their_solo_runs(sf_and_draft):
    sf, draft = sf_and_draft
    reqs = requests(draft)
    solo = [run(sf, r) for r in reqs]  # one after the other
    assert all(s["metrics"]["proposer_faults"] == 0 for s in solo)
    assert any(s["metrics"]["accepted_nodes"] > 0 for s in solo)
    for rounds in range(3):  # several rounds: interleavings differ from run to run
        results: list = [None] * len(reqs)
        errors: list = []
        barrier = threading.Barrier(4)

        def worker(t: int) -> None:
            try:
                barrier.wait()
                for i in range(t, len(reqs), 4):  # thread t runs requests t, t + 4, t + 8
                    results[i] = run(sf, reqs[i])
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        for i, (got, want) in enumerate(zip(results, solo)):
            assert got == want, (rounds, i, reqs[i]["proposers"])
    # the pool keeps a bounded number of idle instances for later requests
    from specframe.api import POOL_IDLE

    assert 0 < len(sf._plugins.pool) <= POOL_IDLE
