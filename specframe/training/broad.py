"""The broad prompt mix for self-distillation: what people ask a chat model, from the sources in
:mod:`specframe.training.sources` plus specframe's own templates (Apache-2.0). Never Spec-Bench text.

``build_broad_prompts(n, seed)`` returns ``n`` items ``{"kind", "source", "text"}`` in a seeded order; about
``followup_share`` of them also carry ``"followup"``: a second user turn, asked after the target's own first
answer (the corpus builder generates it in a second stage).

Kinds and shares: chat (conversation openers and follow-ups), question (open questions), explain (STEM and
humanities explanations), writing, roleplay, reasoning, math (arithmetic and word problems), code, extraction,
translate, summarize, passage-qa.
"""

from __future__ import annotations

import random
from typing import Callable, Iterator

from . import sources as S

SHARES = {
    "chat": 0.19, "question": 0.10, "explain": 0.13, "writing": 0.09, "roleplay": 0.04, "reasoning": 0.06,
    "math": 0.08, "code": 0.11, "extraction": 0.05, "translate": 0.04, "summarize": 0.05, "passage-qa": 0.06,
}
FOLLOWUP_SHARE = 0.10

_FIELDS = {
    "phenomenon": "physics", "process": "biology or chemistry", "substance": "chemistry", "body": "biology",
    "plant": "botany", "animal": "biology", "cognition": "psychology", "communication": "linguistics",
    "act": "history or social science", "event": "history", "attribute": "science", "state": "medicine or society",
    "group": "sociology", "possession": "economics", "feeling": "psychology", "time": "history",
    "artifact": "engineering", "location": "geography", "object": "earth science", "food": "nutrition",
}
_AUDIENCES = ["a ten-year-old", "a high-school student", "a complete beginner", "a busy manager", "a university student",
              "my grandmother", "someone learning English"]
_FORMS = ["short story", "poem", "haiku", "blog post", "formal email", "product description", "speech", "diary entry",
          "persuasive paragraph", "news report", "travel guide entry", "limerick", "short essay", "song chorus",
          "cover letter", "restaurant review", "social media post", "letter to a friend", "fable", "riddle"]
_TONES = ["funny", "serious", "inspiring", "mysterious", "friendly", "formal", "nostalgic", "optimistic"]
_LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
_CODE_LANGS = ["Python"] * 5 + ["JavaScript", "JavaScript", "C", "C++", "Java", "Go", "Rust", "SQL", "Bash", "TypeScript"]
_CODE_TASKS = [
    "reverse a string", "check whether a number is prime", "find the largest element in a list",
    "count the words in a text", "remove duplicates from a list while keeping the order", "compute the factorial of n",
    "return the n-th Fibonacci number", "check whether a string is a palindrome", "merge two sorted lists",
    "flatten a nested list", "convert Celsius to Fahrenheit", "read a CSV file and sum one column",
    "count how often each character appears in a string", "find the second smallest number in a list",
    "validate an email address", "sort a list of dictionaries by one key", "implement binary search",
    "compute the greatest common divisor of two numbers", "rotate a list by k positions", "transpose a matrix",
    "check whether two strings are anagrams", "compute the average of a list of numbers", "find all even numbers in a list",
    "capitalize the first letter of every word", "parse a date string and print the weekday",
    "implement a stack with push and pop", "implement a queue using two stacks", "compute the sum of digits of a number",
    "generate all permutations of a string", "find the longest word in a sentence", "count vowels in a string",
    "check whether a year is a leap year", "convert a decimal number to binary", "merge two dictionaries",
    "find the intersection of two lists", "compute a running total of a list", "split a list into chunks of size n",
    "write a simple class for a bank account with deposit and withdraw", "retry a function call up to three times",
    "read a text file line by line and print the line numbers", "implement bubble sort", "implement quicksort",
    "find the most common element in a list", "compute the dot product of two vectors",
    "check whether brackets in a string are balanced", "convert a Roman numeral to an integer",
    "compute compound interest", "remove whitespace from both ends of every line in a file",
    "group a list of words by their first letter", "return the n largest values of a list",
]
_CODE_ASKS = ["Write a {lang} function to {task}.", "How do I {task} in {lang}?",
              "Write {lang} code to {task}. Explain how it works.", "Show me a short {lang} program that can {task}.",
              "Write a {lang} function to {task}, with comments.", "What is the simplest way to {task} in {lang}?"]
_CODE_CONCEPTS = ["recursion", "a hash table", "a linked list", "big-O notation", "a closure", "a race condition",
                  "garbage collection", "an API", "a REST endpoint", "object-oriented programming", "a unit test",
                  "version control with git", "a database index", "a binary tree", "dynamic programming",
                  "an exception", "a compiler", "an interpreter", "a virtual environment", "asynchronous code",
                  "a regular expression", "a memory leak", "a pointer", "type hints", "a decorator", "a generator",
                  "SQL joins", "caching", "a deadlock", "functional programming"]
_PYFUNCS = ["sorted", "enumerate", "zip", "map", "filter", "isinstance", "getattr", "any", "all", "range", "open",
            "dict.get", "str.join", "str.split", "list.append", "set.union", "collections.Counter",
            "itertools.chain", "functools.lru_cache", "pathlib.Path", "json.loads", "re.sub", "datetime.timedelta",
            "random.choice", "math.isclose", "os.path.join", "subprocess.run", "argparse.ArgumentParser"]
_FOLLOWUPS = [
    "Can you give me an example?", "Can you explain that more simply?", "Summarize your answer in one sentence.",
    "Thanks! What else should I know about this?", "Can you make it shorter?", "Why is that?",
    "Can you turn that into a bulleted list?", "Now write it in a more formal tone.", "Are you sure? Please check.",
    "What would be a common mistake here?", "How would you explain this to a child?", "Can you go into more detail?",
    "What are the pros and cons?", "Could you add a title?", "Great. Can you give me three more ideas?",
]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_NAMES = ["Maria", "James", "Aiko", "Liam", "Fatima", "Noah", "Elena", "Omar", "Sofia", "Chen", "Grace", "Ravi",
          "Lucas", "Amara", "Yuki", "Hassan", "Ingrid", "Mateo", "Priya", "Tom"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "coins", "shells", "cards",
          "oranges", "toy cars", "flowers", "eggs", "candles"]


def _w(rng: random.Random, cat: str) -> str:
    return rng.choice(S.nouns()[cat])


def _chat(rng: random.Random) -> dict:
    conv = rng.choice(S.conversations())
    if rng.random() < 0.45:
        text = conv[0]
    else:
        cands = [t for t in conv[1:] if len(t.split()) >= 4] or conv
        text = rng.choice(cands)
    item = {"text": text[:600]}
    if rng.random() < 0.25 and len(conv) >= 3:
        item["followup"] = rng.choice(conv[2:])[:600]
    return item


def _question(rng: random.Random) -> dict:
    a = _w(rng, rng.choice(["artifact", "act", "communication", "group", "possession", "state"]))
    b = _w(rng, rng.choice(["cognition", "attribute", "feeling", "event", "location", "food"]))
    t = rng.choice([
        f"What are the pros and cons of {a}?", f"Why do people care about {b}?", f"What do you think about {a}?",
        f"Is {a} a good idea? Why or why not?", f"What is the best way to get better at {b}?",
        f"Give me some advice about {a}.", f"What would the world be like without {a}?",
        f"What are some interesting facts about {b}?", f"How has {a} changed over the last hundred years?",
        f"What is the difference between {a} and {b}?", f"Can you recommend a few ways to enjoy {b}?",
        f"What should I consider before choosing a {a}?", f"Why is {b} important in everyday life?",
    ])
    return {"text": t}


def _explain(rng: random.Random) -> dict:
    cat = rng.choice(list(_FIELDS))
    x = _w(rng, cat)
    t = rng.choice([
        f"Explain {x} in simple terms.", f"What is {x}? Give two examples.", f"Explain {x} to {rng.choice(_AUDIENCES)}.",
        f"What role does {x} play in {_FIELDS[cat]}?", f"Describe {x} in a short paragraph.",
        f"How does {x} work?" if cat in ("artifact", "process", "phenomenon", "body") else f"Where does the idea of {x} come from?",
        f"Write a short encyclopedia entry about {x}.", f"What are the main facts everyone should know about {x}?",
    ])
    return {"text": t}


def _writing(rng: random.Random) -> dict:
    subj = _w(rng, rng.choice(["artifact", "animal", "location", "event", "person", "food", "plant", "feeling"]))
    form = rng.choice(_FORMS)
    t = rng.choice([
        f"Write a {form} about {subj}.", f"Write a {rng.choice(_TONES)} {form} about {subj}.",
        f"Write a {form} about {subj} for {rng.choice(_AUDIENCES)}.", f"Give me five creative ideas for a {form} about {subj}.",
        f"Write the opening paragraph of a novel that involves {subj}.", f"Write a {form} that mentions {subj} and "
        f"{_w(rng, 'object')}.",
    ])
    return {"text": t}


def _roleplay(rng: random.Random) -> dict:
    p, q = _w(rng, "person"), _w(rng, "person")
    topic = _w(rng, rng.choice(["artifact", "event", "act", "location"]))
    t = rng.choice([
        f"Pretend you are a {p}. Describe a typical day at work.", f"You are a {p}. A visitor asks you about {topic}. "
        "What do you say?", f"Role-play a short conversation between a {p} and a {q} about {topic}.",
        f"Act as a {p} and give me three tips about {topic}.", f"Imagine you are a {p} writing a letter home. Write it.",
        f"You are a friendly {p}. Introduce yourself and explain what you do.",
    ])
    return {"text": t}


def _reasoning(rng: random.Random) -> dict:
    names = rng.sample(_NAMES, 4)
    kind = rng.randrange(6)
    if kind == 0:
        adj = rng.choice([("taller", "tallest"), ("older", "oldest"), ("faster", "fastest"), ("heavier", "heaviest")])
        t = (f"{names[0]} is {adj[0]} than {names[1]}. {names[1]} is {adj[0]} than {names[2]}. {names[3]} is "
             f"{adj[0]} than {names[0]}. Who is the {adj[1]}? Explain.")
    elif kind == 1:
        d, n = rng.choice(_DAYS), rng.randint(3, 100)
        t = f"If today is {d}, what day of the week will it be in {n} days? Explain your reasoning."
    elif kind == 2:
        a, s = rng.randint(1, 20), rng.randint(2, 9)
        op = rng.choice(["+", "*"])
        seq = [a]
        for _ in range(4):
            seq.append(seq[-1] + s if op == "+" else seq[-1] * s if seq[-1] < 10_000 else seq[-1] + s)
        t = f"What is the next number in the sequence {', '.join(map(str, seq))}? Explain the pattern."
    elif kind == 3:
        x, y = _w(rng, "animal"), _w(rng, "animal")
        t = (f"All {x}s in the zoo are fed at noon. Some animals fed at noon are {y}s. Can we conclude that some "
             f"{x}s are {y}s? Explain.")
    elif kind == 4:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        t = (f"A bat and a ball cost ${a}.{b}0 in total. The bat costs ${a - 1}.00 more than the ball. How much does "
             "the ball cost? Think carefully.")
    else:
        t = (f"{names[0]}, {names[1]} and {names[2]} each have a different pet: a cat, a dog and a parrot. "
             f"{names[0]} does not have the dog. {names[1]} has the parrot. Who has which pet?")
    return {"text": t}


def _math(rng: random.Random) -> dict:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(5, 90), rng.randint(2, 40), rng.randint(1, 30)
    kind = rng.randrange(8)
    if kind == 0:
        t = f"{name} has {a} {item}, buys {b} more and gives {c} away. How many {item} are left? Think step by step."
    elif kind == 1:
        p = rng.randint(2, 15)
        t = f"{item.capitalize()} cost ${p} each. {name} buys {b} and pays with ${p * b + c}. How much change is there?"
    elif kind == 2:
        t = f"What is {rng.randint(12, 999)} {rng.choice(['+', '-', '*'])} {rng.randint(12, 999)}? Show your work."
    elif kind == 3:
        t = f"What is {rng.choice([5, 10, 15, 20, 25, 30, 40, 75])}% of {rng.randint(20, 900)}?"
    elif kind == 4:
        v, h = rng.randint(30, 120), rng.randint(2, 9)
        t = f"A train travels at {v} km/h for {h} hours and then {c} km more. How far does it travel in total?"
    elif kind == 5:
        x, m, k = rng.randint(1, 20), rng.randint(2, 9), rng.randint(1, 30)
        t = f"Solve for x: {m}x + {k} = {m * x + k}. Explain each step."
    elif kind == 6:
        t = f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?"
    else:
        t = f"{name} saves ${b} a week. How many weeks until {name} has ${b * c + a}? Round up and explain."
    return {"text": t}


def _code(rng: random.Random) -> dict:
    kind = rng.randrange(5)
    if kind <= 1:
        t = rng.choice(_CODE_ASKS).format(lang=rng.choice(_CODE_LANGS), task=rng.choice(_CODE_TASKS))
    elif kind == 2:
        t = f"Explain what this Python code does:\n\n```python\n{rng.choice(S.doc_code())}\n```"
    elif kind == 3:
        t = rng.choice([f"Explain {rng.choice(_CODE_CONCEPTS)} with a short code example.",
                        f"What is {rng.choice(_CODE_CONCEPTS)} in programming?",
                        f"How do I use {rng.choice(_PYFUNCS)} in Python? Show an example."])
    else:
        t = f"Rewrite this Python code to make it clearer, and explain the changes:\n\n```python\n{rng.choice(S.doc_code())}\n```"
    return {"text": t}


def _faker(seed: int):
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    return fake


def _extraction(rng: random.Random) -> dict:
    f = _faker(rng.randrange(1 << 30))
    kind = rng.randrange(4)
    if kind == 0:
        t = (f"Extract the name, email address and phone number from this message and return them as JSON:\n\n"
             f"Hi, this is {f.name()} from {f.company()}. You can reach me at {f.email()} or {f.phone_number()}. "
             f"I'm writing about order {f.bothify('??-####').upper()}.")
    elif kind == 1:
        rows = "\n".join(f"{f.name()}; {f.job()}; {f.city()}" for _ in range(rng.randint(3, 5)))
        t = f"Turn these records (name; job; city) into a Markdown table:\n\n{rows}"
    elif kind == 2:
        t = f"What is the city, the state and the postcode in this address?\n\n{f.address()}"
    else:
        items = ", ".join(f"{rng.randint(1, 5)} x {rng.choice(_ITEMS)} at ${rng.randint(1, 20)}" for _ in range(3))
        t = (f"From this order, list each item with its quantity and compute the total price.\n\nCustomer: {f.name()}"
             f"\nDate: {f.date()}\nItems: {items}")
    return {"text": t}


def _translate(rng: random.Random) -> dict:
    if rng.random() < 0.5:
        cands = [t for t in rng.choice(S.conversations()) if 5 <= len(t.split()) <= 30] or ["How are you doing today?"]
        sent = rng.choice(cands)
    else:
        sent = " ".join(rng.choice(S.doc_passages())[1].split(". ")[0].split()[:30]) + "."
    return {"text": rng.choice([f"Translate into {rng.choice(_LANGS)}: {sent}",
                                f"How would you say this in {rng.choice(_LANGS)}? \"{sent}\""])}


def _summarize(rng: random.Random) -> dict:
    title, passage = rng.choice(S.doc_passages())
    t = rng.choice([f"Summarize the following text in a few sentences.\n\n{passage}",
                    f"Give three bullet points that capture the main ideas of this text:\n\n{passage}",
                    f"Write a one-sentence summary and a title for this passage:\n\n{passage}",
                    f"Explain this passage to a beginner:\n\n{passage}"])
    return {"text": t}


def _passage_qa(rng: random.Random) -> dict:
    title, passage = rng.choice(S.doc_passages())
    q = rng.choice([f"What does the passage say about {title}?", "What is the main point of the passage?",
                    "What example or detail does the passage give?", "Who would find this passage useful, and why?",
                    "According to the passage, what should a programmer be careful about?"])
    return {"text": f"Read the passage and answer the question.\n\nPassage: {passage}\n\nQuestion: {q}"}


MAKERS: dict[str, Callable[[random.Random], dict]] = {
    "chat": _chat, "question": _question, "explain": _explain, "writing": _writing, "roleplay": _roleplay,
    "reasoning": _reasoning, "math": _math, "code": _code, "extraction": _extraction, "translate": _translate,
    "summarize": _summarize, "passage-qa": _passage_qa,
}
SOURCE_OF = {"chat": "chitchat", "translate": "chitchat+python-docs", "code": "python-docs", "summarize": "python-docs",
             "passage-qa": "python-docs", "extraction": "faker", "question": "wordnet", "explain": "wordnet",
             "writing": "wordnet", "roleplay": "wordnet", "reasoning": "specframe+wordnet", "math": "specframe"}


def build_broad_prompts(n: int, seed: int = 0, followup_share: float = FOLLOWUP_SHARE) -> list[dict]:
    """``n`` seeded prompts ``{"kind", "source", "text"[, "followup"]}`` over the kinds of :data:`SHARES`.

    The first ``m`` of ``build_broad_prompts(n, s)`` are ``build_broad_prompts(m, s)``: kinds follow a fixed
    seeded schedule (a weighted shuffle per block of 100), each item its own seeded generator.

    Raises:
        ConfigError: a source package is not installed (the message says how to install it).
    """
    out: list[dict] = []
    seen: set[str] = set()
    for kind in kind_schedule(SHARES, 100, random.Random(seed)):
        if len(out) == n:
            break
        rng = random.Random(f"{seed}:{len(out)}")
        item = MAKERS[kind](rng)
        for _ in range(8):  # a repeated prompt (common chat openers, templates) is drawn again
            if item["text"] not in seen:
                break
            item = MAKERS[kind](rng)
        seen.add(item["text"])
        if "followup" not in item and rng.random() < followup_share:
            item["followup"] = rng.choice(_FOLLOWUPS)
        out.append({"kind": kind, "source": SOURCE_OF[kind], **item})
    return out


def kind_schedule(shares: dict[str, float], per_block: int, rng: random.Random) -> Iterator[str]:
    """Prompt kinds without end, in blocks of ``per_block`` holding ``round(share * per_block)`` of each kind,
    each block shuffled by ``rng``: any prefix follows the shares to within one block."""
    block = [k for k in shares for _ in range(round(shares[k] * per_block))]
    while True:
        order = block[:]
        rng.shuffle(order)
        yield from order
