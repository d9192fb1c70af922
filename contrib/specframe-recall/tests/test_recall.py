"""specframe-recall's tests: the pure cache, and the specframe conformance kit (one line)."""

from specframe.testing import conformance_suite
from specframe_recall import OutputCache, RecallProposer

# The conformance kit: contract, greedy + sampling exactness, rollback, determinism, feedback.
TestRecallConformance = conformance_suite(RecallProposer, config={"k": 4, "min_n": 2, "max_n": 4})


def test_docstring_example() -> None:
    cache = OutputCache(min_n=2, max_n=3, max_outputs=8)
    cache.add(prompt=(1, 2), output=[7, 8, 9, 10, 11])
    assert cache.lookup(prompt=(1, 2), generated=[7, 8], k=3) == [9, 10, 11]  # same prompt, same start
    assert cache.lookup(prompt=(5,), generated=[3, 8, 9], k=3) == [10, 11]  # suffix [8, 9] seen before


def test_same_prompt_drafts_from_the_start() -> None:
    cache = OutputCache(min_n=2, max_n=3, max_outputs=8)
    cache.add(prompt=(4, 4), output=[1, 2, 3])
    assert cache.lookup(prompt=(4, 4), generated=[], k=2) == [1, 2]
    assert cache.lookup(prompt=(4, 4), generated=[1, 2, 3], k=2) == []  # nothing after the end


def test_diverged_output_falls_back_to_ngrams() -> None:
    cache = OutputCache(min_n=2, max_n=3, max_outputs=8)
    cache.add(prompt=(4,), output=[1, 2, 3, 5, 6])
    assert cache.lookup(prompt=(4,), generated=[9, 3, 5], k=2) == [6]  # not a prefix; [3, 5] -> 6
    assert cache.lookup(prompt=(4,), generated=[9, 9], k=2) == []


def test_most_recent_output_wins_and_oldest_is_evicted() -> None:
    cache = OutputCache(min_n=2, max_n=2, max_outputs=2)
    cache.add((0,), [1, 2, 3])
    cache.add((0,), [1, 2, 4])
    assert cache.lookup((9,), [1, 2], k=1) == [4]
    cache.add((7,), [5, 6, 8])  # evicts the first output
    assert list(cache.outputs) == [1, 2]
    assert cache.lookup((9,), [5, 6], k=1) == [8]
    assert all(oid != 0 for oid, _ in cache.grams.values())
