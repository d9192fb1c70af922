"""The ``long`` prompt mix: long-passage tasks of the kinds people send a chat model with a document — summarise
it, answer from several documents (retrieval-augmented), answer from one long passage — so a drafter trains at the
context lengths of those prompts (330 to 2 050 SmolLM2 tokens, median 890; the ``broad`` mix's average 66). Passages
are runs of consecutive paragraphs of the Python documentation (:func:`specframe.training.sources.doc_passages`,
PSF License 2.0), instructions are specframe's own. Never Spec-Bench text.

``build_long_prompts(n, seed)`` returns ``n`` items ``{"kind", "source", "text"}`` in a seeded order; the first
``m`` of ``n`` are ``build_long_prompts(m, seed)``.

Kinds and shares: summarize-long 0.4, documents-qa 0.35 (3 to 6 documents, the answer in one), passage-qa-long 0.25.
"""

from __future__ import annotations

import random
from typing import Callable

from . import sources as S
from .broad import kind_schedule

SHARES = {"summarize-long": 0.40, "documents-qa": 0.35, "passage-qa-long": 0.25}
MIN_WORDS, MAX_WORDS = 400, 1400  # of a long text (a run of passages)


def _run_of_passages(rng: random.Random, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> tuple[str, str]:
    """``(title of the first passage, text)``: consecutive passages from a random start, joined as paragraphs,
    until at least a seeded length between ``min_words`` and ``max_words`` is reached."""
    passages = S.doc_passages()
    goal = rng.randint(min_words, max_words)
    start = rng.randrange(len(passages))
    title, parts, words = passages[start][0], [], 0
    for i in range(start, start + len(passages)):
        text = passages[i % len(passages)][1]
        parts.append(text)
        words += len(text.split())
        if words >= goal:
            break
    return title, "\n\n".join(parts)


def _summarize_long(rng: random.Random) -> dict:
    _, text = _run_of_passages(rng)
    head = rng.choice(["Summarize this document.", "Summarize:", "Write a short summary of the following text.",
                       "What are the key points of this article? Answer in a short paragraph.",
                       "Condense the following into three or four sentences."])
    return {"text": f"{head}\n\n{text}" if not head.endswith(":") else f"{head} {text}"}


def _documents_qa(rng: random.Random) -> dict:
    passages = S.doc_passages()
    k = rng.randint(3, 6)
    picks = rng.sample(range(len(passages)), k)
    answer_in = rng.randrange(k)
    title = passages[picks[answer_in]][0]
    docs = "\n\n".join(f"Document {j + 1} ({passages[i][0]}): {passages[i][1]}" for j, i in enumerate(picks))
    q = rng.choice([f"What do the documents say about {title}?", f"Using the documents, explain {title} briefly.",
                    f"Which document discusses {title}, and what does it say?",
                    f"Based only on the documents above, what should a reader know about {title}?"])
    return {"text": rng.choice([f"{docs}\n\nQuestion: {q}",
                                f"Answer the question using the documents below.\n\n{docs}\n\nQuestion: {q}"])}


def _passage_qa_long(rng: random.Random) -> dict:
    title, text = _run_of_passages(rng, MIN_WORDS, MAX_WORDS * 3 // 4)
    q = rng.choice([f"What does the text say about {title}?", "What is the main point of the text?",
                    "List the most important details the text gives.", "What should a programmer be careful about, "
                    "according to the text?", "Explain the second paragraph in simpler words."])
    return {"text": f"Read the text and answer the question.\n\n{text}\n\nQuestion: {q}"}


MAKERS: dict[str, Callable[[random.Random], dict]] = {
    "summarize-long": _summarize_long, "documents-qa": _documents_qa, "passage-qa-long": _passage_qa_long,
}


def build_long_prompts(n: int, seed: int = 0) -> list[dict]:
    """``n`` seeded prompts ``{"kind", "source", "text"}`` over the kinds of :data:`SHARES` (a weighted shuffle per
    block of 20, each item its own seeded generator): the first ``m`` of ``n`` are the ``m`` of ``m``.

    Raises:
        ConfigError: the Python documentation sources are not installed (the message says how to install them).
    """
    out: list[dict] = []
    for kind in kind_schedule(SHARES, 20, random.Random(f"long:{seed}")):
        if len(out) == n:
            break
        item = MAKERS[kind](random.Random(f"long:{seed}:{len(out)}"))
        out.append({"kind": kind, "source": "python-docs", **item})
    return out
