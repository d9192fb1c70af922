"""Spec-Bench questions as structured-output tasks (issue 54 a, b): a JSON schema per category, the question asking
for that JSON, written as a prompts file whose records carry a ``constraint`` (``specframe bench`` and
``lab/scripts/constrained_exactness.py`` decode under it).

    python lab/scripts/constrained_questions.py --questions ../shared/specbench/question.jsonl \
        --per-category 4 --out lab/data/specbench-json/question.jsonl

Every schema bounds its strings and arrays (``maxLength`` / ``maxItems``), so a finished answer fits in 128 tokens
more often than not; an answer cut by ``max_new_tokens`` is a valid prefix.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props), "additionalProperties": False}


def _text(n: int) -> dict:
    return {"type": "string", "maxLength": n}


SCHEMAS = {
    "translation": _obj({"source_language": _text(20), "target_language": _text(20), "translation": _text(300)}),
    "summarization": _obj({"title": _text(60), "summary": _text(300),
                           "key_points": {"type": "array", "items": _text(80), "minItems": 1, "maxItems": 3}}),
    "qa": _obj({"answer": _text(200), "confidence": {"enum": ["low", "medium", "high"]}}),
    "math_reasoning": _obj({"steps": {"type": "array", "items": _text(120), "maxItems": 4},
                            "answer": {"type": "number"}}),
    "rag": _obj({"answer": _text(250), "quotes": {"type": "array", "items": _text(100), "maxItems": 2}}),
    "coding": _obj({"language": {"enum": ["python", "javascript", "c", "sql", "other"]}, "code": _text(400),
                    "explanation": _text(150)}),
}


def instruction(schema: dict) -> str:
    fields = ", ".join(f'"{k}"' for k in schema["properties"])
    return f"\n\nReply with one JSON object with the fields {fields} and nothing else."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", required=True)
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    taken: dict[str, int] = {}
    out = []
    for line in Path(a.questions).read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        cat = q["category"]
        if cat not in SCHEMAS or taken.get(cat, 0) >= a.per_category:
            continue
        taken[cat] = taken.get(cat, 0) + 1
        schema = SCHEMAS[cat]
        out.append({"question_id": q["question_id"], "category": cat, "turns": [q["turns"][0] + instruction(schema)],
                    "constraint": {"json_schema": schema}})
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out), encoding="utf-8")
    print(f"{len(out)} questions ({', '.join(f'{k} {v}' for k, v in taken.items())}) -> {a.out}")


if __name__ == "__main__":
    main()
