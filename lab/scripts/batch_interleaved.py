"""Batched throughput of none, ngram and ngram+medusa, interleaved (every strategy once per repetition, in turn),
so that the machine's drift between runs falls on every strategy alike: the ratio to `none` per repetition and the
median over repetitions. Issue 37 b; one Specframe (default model, `auto` dtype), the 30 dev questions, 128 tokens.

    python lab/scripts/batch_interleaved.py REPS CONCURRENCIES OUT.json     # e.g. 3 4,8 interleaved.json
"""
import collections
import json
import statistics
import sys
import time

import specframe
from specframe.bench.runner import select_questions
from specframe.io.prompts import read_prompts

sf = specframe.load(model="smollm2-135m-instruct", dtype="auto")
qs = select_questions(read_prompts("../shared/specbench/question.jsonl"), None, 5)
enc = [sf.encode(q.text, True) for q in qs]
strategies = [("none", ["none"]), ("ngram", ["ngram"]), ("ngram+medusa", ["ngram", "medusa"])]
for _, p in strategies:
    sf.generate_batch_results(enc[:8], batch_size=8, max_new_tokens=8, proposers=p)
reps = int(sys.argv[1])
cs = [int(c) for c in sys.argv[2].split(",")]
out = collections.defaultdict(list)
for r in range(reps):
    for c in cs:
        for name, props in strategies:
            t0 = time.perf_counter()
            res = sf.generate_batch_results(enc, batch_size=c, max_new_tokens=128, proposers=props)
            wall = time.perf_counter() - t0
            n = sum(len(x.token_ids) for x in res)
            out[f"{name}@{c}"].append(n / wall)
            print(r, c, name, round(n / wall, 1), flush=True)
summary = {k: {"runs": [round(x, 1) for x in v], "median": round(statistics.median(v), 1)} for k, v in out.items()}
for c in cs:
    base = summary[f"none@{c}"]["median"]
    for name, _ in strategies:
        e = summary[f"{name}@{c}"]
        e["x_none_median"] = round(e["median"] / base, 3)
        e["x_none_paired"] = [round(a / b, 3) for a, b in zip(out[f"{name}@{c}"], out[f"none@{c}"])]
json.dump(summary, open(sys.argv[3], "w"), indent=1)
print(json.dumps(summary, indent=1))
