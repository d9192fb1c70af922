"""An agent loop of the OpenAI Agents SDK (PyPI ``openai-agents``) against ``specframe serve`` (issue 68, must-show
a): two tools, three turns, each turn run whole and streamed, under each strategy given; the transcripts (every
tool call with its arguments, every tool result, every answer) are written as JSON and compared across strategies.

The SDK is not a specframe dependency: run this with a Python that has it (``pip install openai-agents``), against
a server started apart, e.g.::

    specframe serve --model smollm2-135m-instruct --config lab/configs/serve.fp32.yaml --port 8011 &
    python lab/scripts/agent_loop.py --base-url http://127.0.0.1:8011/v1 --strategy none \
        --strategy grammar+ngram --output lab/results/agent-loop-issue68/transcripts.json

A strategy is sent per request as the body's ``speculative`` field (``none``: no proposers). The tools run here:
``add`` adds two integers, ``weather`` looks a city up in a fixed table (an unknown city gets "no data"). A turn
ends at the model's first tool call (its result is the turn's answer: the SDK's ``stop_on_first_tool``) or at its
text answer: SmolLM2-135M, which has never seen tool results, would otherwise call tools until ``max_turns``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

TURNS = [
    "What is 17 plus 25? Use the add tool.",
    "What is the weather in Paris? Use the weather tool.",
    "Thanks. Now add 3 and 4, then tell me the result in one sentence.",
]
WEATHER = {"paris": "14 C, light rain", "london": "11 C, cloudy", "tokyo": "19 C, clear"}


def build_agent(base_url: str, strategy: str, calls: list[dict[str, Any]]) -> Any:
    """The agent: the SDK's Chat Completions model on ``base_url``, greedy, ``tool_choice`` left to the SDK's
    default (``auto``), the strategy in ``extra_body``; every tool call is appended to ``calls``."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append({"tool": "add", "arguments": {"a": a, "b": b}})
        return a + b

    @function_tool
    def weather(city: str) -> str:
        """The current weather in a city."""
        calls.append({"tool": "weather", "arguments": {"city": city}})
        return WEATHER.get(str(city).strip().lower(), "no data")

    client = AsyncOpenAI(base_url=base_url, api_key="unused")
    proposers = strategy.split("+")
    extra = {"speculative": {"proposers": proposers}}
    settings = ModelSettings(temperature=0.0, max_tokens=96, extra_body=extra)
    # a 135M model that has never seen tool results calls tools again and again: each user turn ends at its first
    # tool call, whose result is the turn's answer (the SDK's stop_on_first_tool); a turn it answers in text ends
    # there too
    return Agent(name="helper", instructions="You are a helpful assistant. Use the tools when they help.",
                 tools=[add, weather], model=OpenAIChatCompletionsModel(model="smollm2-135m-instruct",
                                                                        openai_client=client),
                 model_settings=settings, tool_use_behavior="stop_on_first_tool")


async def run_turns(base_url: str, strategy: str, stream: bool, max_turns: int) -> dict[str, Any]:
    """Three user turns, each continuing the conversation; returns the transcript."""
    from agents import Runner

    calls: list[dict[str, Any]] = []
    agent = build_agent(base_url, strategy, calls)
    history: list[Any] = []
    turns = []
    for text in TURNS:
        history = history + [{"role": "user", "content": text}]
        seen = len(calls)
        if stream:
            result = Runner.run_streamed(agent, history, max_turns=max_turns)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, history, max_turns=max_turns)
        turns.append({"user": text, "calls": calls[seen:], "answer": result.final_output})
        history = result.to_input_list()
    return {"strategy": strategy, "stream": stream, "turns": turns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="the server's /v1 address")
    ap.add_argument("--strategy", action="append", default=[], help="none, or proposers joined by + (repeatable)")
    ap.add_argument("--max-turns", type=int, default=6, help="model calls per user turn at most (the SDK's max_turns)")
    ap.add_argument("--output", type=Path, help="write the transcripts here (JSON)")
    args = ap.parse_args(argv)
    strategies = args.strategy or ["none"]
    runs = []
    for strategy in strategies:
        for stream in (False, True):
            run = asyncio.run(run_turns(args.base_url, strategy, stream, args.max_turns))
            runs.append(run)
            n = sum(len(t["calls"]) for t in run["turns"])
            print(f"{strategy:>16} {'streamed' if stream else 'whole':>8}: {n} tool calls executed; answers "
                  f"{[t['answer'][:60] if isinstance(t['answer'], str) else t['answer'] for t in run['turns']]}")
    base = [t for t in runs[0]["turns"]]
    same = {f"{r['strategy']} {'streamed' if r['stream'] else 'whole'}": r["turns"] == base for r in runs}
    print("identical to the first transcript: " + ", ".join(f"{k} {v}" for k, v in same.items()))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"turns": TURNS, "runs": runs, "identical": same}, indent=1))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
