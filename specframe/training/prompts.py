"""Training prompts for self-distillation: never Spec-Bench questions.

Passages come from ``pydoc_data.topics`` — the Python reference manual's topic texts, shipped with every CPython
(Debian: ``libpython3.X-stdlib``) under the PSF License 2.0, which allows commercial use. The task templates,
word lists and the synthetic arithmetic problems below are specframe's own (Apache-2.0). The target answers
every prompt itself, so the responses are the target's own output (self-distillation).
"""

from __future__ import annotations

import random
import re

SOURCE = "pydoc_data.topics (Python reference manual topics, PSF License 2.0; CPython stdlib / Debian libpython3-stdlib)"

_SUBJECTS = [
    "a lighthouse keeper", "the history of bread", "a small mountain village", "learning to play the violin",
    "a robot that gardens", "the water cycle", "a rainy afternoon in a library", "the first day at a new job",
    "how bees communicate", "a trip to the seaside", "an old clock repair shop", "renewable energy at home",
    "a chess tournament", "the life of a river", "volunteering at an animal shelter", "a city at night",
    "the invention of the printing press", "a family recipe", "training for a marathon", "the migration of birds",
    "a neighbourhood market", "solar eclipses", "a letter from the future", "friendship between two rivals",
    "the importance of sleep", "a museum of forgotten things", "starting a vegetable garden", "ocean tides",
    "a long train journey", "the role of bridges in cities", "teaching a child to ride a bike", "coffee farming",
]
_FORMS = [
    "short story", "poem", "blog post", "formal email", "product description", "speech", "diary entry",
    "persuasive paragraph", "news report", "travel guide entry", "dialogue between two friends", "short essay",
]
_QUESTIONS = [
    "Why is the sky blue?", "How do vaccines work?", "What causes the seasons on Earth?",
    "How does a refrigerator keep food cold?", "What is the difference between weather and climate?",
    "Why do we have leap years?", "How do airplanes stay in the air?", "What is photosynthesis?",
    "How does the stock market work?", "What is inflation?", "Why do cats purr?", "How are rainbows formed?",
    "What does a central bank do?", "How do plants know which way is up?", "What is a black hole?",
    "How does the heart pump blood?", "What are the benefits of regular exercise?", "Why is the ocean salty?",
    "How do computers store information?", "What is the greenhouse effect?", "How do earthquakes happen?",
    "What is the difference between a virus and a bacterium?", "How does recycling help the environment?",
    "Who invented the telephone and how did it change the world?", "What are prime numbers used for?",
]
_NAMES = ["Maria", "James", "Aiko", "Liam", "Fatima", "Noah", "Elena", "Omar", "Sofia", "Chen", "Grace", "Ravi"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "coins", "shells", "cards"]
_LANGS = ["French", "Spanish", "German"]


def passages(min_words: int = 60, max_words: int = 260) -> list[tuple[str, str]]:
    """``(topic, passage)`` pairs: each reference topic cut into paragraphs of ``min_words``..``max_words`` words."""
    import pydoc_data.topics as topics

    out = []
    for key in sorted(topics.topics):
        text = topics.topics[key]
        paras = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text)]
        chunk: list[str] = []
        for p in paras:
            if not p:
                continue
            chunk.append(p)
            words = sum(len(c.split()) for c in chunk)
            if words >= min_words:
                out.append((key, " ".join(" ".join(chunk).split()[:max_words])))
                chunk = []
    return out


def _math(rng: random.Random) -> str:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(5, 90), rng.randint(2, 40), rng.randint(1, 30)
    price = rng.randint(2, 15)
    kind = rng.randrange(3)
    if kind == 0:
        return (f"{name} has {a} {item}. {name} buys {b} more and then gives {c} to a friend. "
                f"How many {item} does {name} have now? Think step by step.")
    if kind == 1:
        return (f"A shop sells {item} for ${price} each. {name} buys {b} of them and pays with a ${price * b + c} "
                f"note. How much change does {name} get? Explain your reasoning.")
    return (f"{name} reads {b} pages every day. The book has {a * 3 + b} pages. After {rng.randint(2, 6)} days, "
            "how many pages are left? Show your work.")


def build_prompts(n: int, seed: int = 0) -> list[dict]:
    """``n`` seeded training prompts ``{"kind", "text"}`` over nine task kinds (summaries, passage QA, rewriting,
    explanation, translation, writing, open questions, arithmetic word problems, list-making)."""
    rng = random.Random(seed)
    pas = passages()
    out = []
    for i in range(n):
        kind = ["summarize", "passage-qa", "rewrite", "explain", "translate", "write", "question", "math", "list"][i % 9]
        topic, passage = rng.choice(pas)
        if kind == "summarize":
            text = f"Summarize the following text in a few sentences.\n\n{passage}"
        elif kind == "passage-qa":
            text = (f"Use the passage to answer the question.\n\nPassage: {passage}\n\n"
                    f"Question: What does the passage say about {topic.replace('-', ' ')}?")
        elif kind == "rewrite":
            text = f"Rewrite the following text in plain, simple English.\n\n{passage}"
        elif kind == "explain":
            text = f"Explain what '{topic.replace('-', ' ')}' means in Python, with a short example."
        elif kind == "translate":
            sent = " ".join(passage.split()[: rng.randint(12, 30)])
            text = f"Translate the following text into {rng.choice(_LANGS)}: {sent}"
        elif kind == "write":
            text = f"Write a {rng.choice(_FORMS)} about {rng.choice(_SUBJECTS)}."
        elif kind == "question":
            text = rng.choice(_QUESTIONS)
        elif kind == "math":
            text = _math(rng)
        else:
            text = f"List {rng.randint(3, 7)} practical tips about {rng.choice(_SUBJECTS)}."
        out.append({"kind": kind, "text": text})
    return out
