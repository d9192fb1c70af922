"""A host loop written from the docs alone by a newcomer who had not seen the code (issue 56 c; docs/how-it-works.md,
"Driving requests yourself"): two requests, each with its own lease, stepped alternately in one loop, compared with
``generate_result``; and a sampled request stepped by hand as the docs say (the lease and the request given the same
``SamplingParams``, the request the seed)."""

import pytest

import specframe
from specframe import SamplingParams

MAX_NEW = 24
JOBS = [
    ("Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox", ["ngram"]),
    ("Name three rivers in Europe.", ["none"]),
]


@pytest.mark.slow
def test_two_requests_interleaved_by_hand_equal_generate_result():
    sf = specframe.load(dtype="float32", proposers=["ngram"])
    try:
        leases, reqs = [], []
        try:
            for prompt, proposers in JOBS:
                lease = sf.lease(proposers=proposers)
                leases.append(lease)
                reqs.append(lease.engine.request(sf.prompt_ids(prompt), max_new_tokens=MAX_NEW))
            for req in reqs:
                req.start()
            steps = [0] * len(reqs)
            while not all(r.finished for r in reqs):
                for i, req in enumerate(reqs):  # one step of each unfinished request per round
                    if req.finished:
                        continue
                    merged, t0, t1 = req.draft()
                    req.verify(merged, t0, t1)
                    steps[i] += 1
            results = [r.result() for r in reqs]
        finally:
            for req in reqs:  # requests first, then their leases
                req.close()
            for lease in leases:
                lease.release()

        assert all(s > 0 for s in steps)
        for (prompt, proposers), got in zip(JOBS, results):
            want = sf.generate_result(prompt, proposers=proposers, max_new_tokens=MAX_NEW)
            assert got.token_ids == want.token_ids, (prompt, proposers)
            assert got.finish_reason == want.finish_reason, (prompt, proposers)
            assert 0 < len(got.token_ids) <= MAX_NEW
    finally:
        sf.close()


@pytest.mark.slow
def test_a_sampled_request_stepped_by_hand_equals_generate_result():
    sf = specframe.load(dtype="float32", proposers=["ngram"])
    try:
        prompt = "Repeat exactly: one two three four, one two three four, one two"
        sp = SamplingParams(temperature=0.8, top_p=0.95)
        with sf.lease(proposers=["ngram"], sampling=sp) as lease:
            req = lease.engine.request(sf.prompt_ids(prompt), max_new_tokens=MAX_NEW, sampling=sp, seed=7)
            try:
                req.start()
                while not req.finished:
                    req.verify(*req.draft())
                got = req.result()
            finally:
                req.close()
        want = sf.generate_result(prompt, proposers=["ngram"], max_new_tokens=MAX_NEW, temperature=0.8, top_p=0.95,
                                  seed=7)
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        other = sf.generate_result(prompt, proposers=["ngram"], max_new_tokens=MAX_NEW, temperature=0.8, top_p=0.95,
                                   seed=8)
        assert other.token_ids != want.token_ids  # the seed decides the draws: the comparison above can fail
    finally:
        sf.close()
