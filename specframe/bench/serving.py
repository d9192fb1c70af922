"""The serving bench (``specframe bench --serve URL`` or a ``servers:`` block in the bench config): the chosen
questions sent to OpenAI-compatible endpoints — ``specframe serve``, ``python -m llama_cpp.server``, ``vllm serve``,
any other — with up to C requests in flight for each C of ``concurrency`` (all arriving at the start, as ``vllm bench
serve --max-concurrency C`` with an infinite request rate), endpoints interleaved within each C.

Every request streams (the official ``openai`` client, ``stream_options.include_usage``). Per request: TTFT (seconds
from sending it to its first content chunk), TPOT (seconds from the first chunk to the last / the tokens after the
first), its tokens (the usage object's ``completion_tokens``; a server that sends no usage: one token per content
chunk, as llama.cpp's server streams) and, from ``specframe serve``, τ (``usage.speculation``). Per (endpoint, C):
throughput (tokens of all requests / wall seconds), TTFT and TPOT mean, p50 and p99, τ (tokens / target forwards
over all requests), failed requests and empty answers (no token: e.g. a server that drops a request when another
arrives). Greedy answers are compared with the first endpoint's at the smallest C.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any, Callable

from ..errors import ConfigError

__all__ = ["check_endpoints", "run_serving", "serving_table", "write_serving_plots"]


def check_endpoints(servers: list[Any], timeout: float = 10.0) -> dict[str, str]:
    """Ask each endpoint's ``GET /models`` before any request: endpoint name -> the model id to request (the
    endpoint's ``model``, else the first the server lists).

    Raises:
        ConfigError: the ``openai`` client is not installed, an endpoint does not answer, or lists no model.
    """
    try:
        import openai
    except ImportError:
        raise ConfigError("the serving bench needs the openai client: pip install 'specframe[serve]'") from None
    models: dict[str, str] = {}
    for ep in servers:
        client = openai.OpenAI(base_url=ep.url, api_key=ep.api_key, timeout=timeout, max_retries=0)
        try:
            listed = [m.id for m in client.models.list().data]
        except openai.APIError as exc:
            raise ConfigError(f"server {ep.name!r}: {ep.url}/models did not answer ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'no reply'}): start the server first, or "
                              "fix the URL (it ends in /v1)") from None
        finally:
            client.close()
        if ep.model is None and not listed:
            raise ConfigError(f"server {ep.name!r}: {ep.url}/models lists no model: set `model` for it")
        models[ep.name] = ep.model or listed[0]
    return models


def run_serving(cfg: Any, chosen: list, models: dict[str, str],
                advance: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """One record per (C, endpoint): its figures (see the module docstring) and its per-request records."""
    servers = cfg.servers
    for ep in servers:  # warm-up: one short request each (not recorded)
        asyncio.run(_endpoint(cfg, ep, models[ep.name], chosen[:1], 1, 8))
        advance(f"warm-up {ep.name}")
    out = []
    for c in cfg.concurrency or [1]:
        for ep in servers:
            rec = asyncio.run(_endpoint(cfg, ep, models[ep.name], chosen, c, cfg.max_new_tokens))
            rec.update(endpoint=ep.name, url=ep.url, model=models[ep.name], concurrency=c)
            for i, r in enumerate(rec["requests"]):
                r.update(question=i, question_id=chosen[i].question_id, category=chosen[i].category)
            out.append(rec)
            advance(f"{ep.name} ×{c}")
    _compare_answers(out, cfg.temperature)
    return out


async def _endpoint(cfg: Any, ep: Any, model: str, chosen: list, c: int, max_tokens: int) -> dict[str, Any]:
    import openai

    client = openai.AsyncOpenAI(base_url=ep.url, api_key=ep.api_key, timeout=ep.timeout_s, max_retries=0)
    gate = asyncio.Semaphore(c)

    async def one(q: Any) -> dict[str, Any]:
        async with gate:
            return await _request(client, cfg, ep, model, q.text, max_tokens)

    try:
        t0 = time.perf_counter()
        requests = await asyncio.gather(*(one(q) for q in chosen))
        wall = time.perf_counter() - t0
    finally:
        await client.close()
    return _figures(list(requests), wall)


async def _request(client: Any, cfg: Any, ep: Any, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    """One streamed request: its text, tokens, TTFT, TPOT, τ, or the error it got."""
    args: dict[str, Any] = dict(model=model, max_tokens=max_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                                seed=cfg.seeds[0], stream=True, stream_options={"include_usage": True})
    extra = dict(ep.extra_body)
    if ep.speculative is not None:
        extra["speculative"] = ep.speculative
    if cfg.top_k:
        extra["top_k"] = cfg.top_k
    chat = ep.api == "chat" if ep.api else cfg.chat
    pieces: list[str] = []
    usage = None
    first = None
    t0 = time.perf_counter()
    try:
        if chat:
            stream = await client.chat.completions.create(messages=[{"role": "user", "content": text}],
                                                          extra_body=extra or None, **args)
        else:
            stream = await client.completions.create(prompt=text, extra_body=extra or None, **args)
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                piece = (choice.delta.content if chat else choice.text) or ""
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                    pieces.append(piece)
    except Exception as exc:  # noqa: BLE001 - a failed request is a figure of the run, not the end of it
        return {"text": "".join(pieces), "new_tokens": 0, "ttft_s": None, "tpot_s": None, "latency_s": None,
                "forwards": None, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    latency = time.perf_counter() - t0
    n = usage.completion_tokens if usage is not None and usage.completion_tokens is not None else len(pieces)
    spec = (usage.model_extra or {}).get("speculation") if usage is not None else None
    return {"text": "".join(pieces), "new_tokens": n, "ttft_s": first, "latency_s": latency,
            "tpot_s": (latency - first) / (n - 1) if first is not None and n > 1 else None,
            "forwards": spec.get("target_forwards") if isinstance(spec, dict) else None, "error": None}


def _figures(requests: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in requests if r["error"] is None]
    tokens = sum(r["new_tokens"] for r in ok)
    fwd = [r["forwards"] for r in ok]
    out: dict[str, Any] = {"wall_s": wall, "tokens": tokens, "throughput": tokens / wall if wall > 0 else 0.0,
                           "failed": len(requests) - len(ok),
                           "empty": sum(1 for r in ok if r["new_tokens"] == 0),  # answered with no token at all
                           "tau": tokens / sum(fwd) if fwd and None not in fwd and sum(fwd) else None}
    for key in ("ttft_s", "tpot_s"):
        v = sorted(r[key] for r in ok if r[key] is not None)
        out[key.replace("_s", "")] = ({"mean_s": statistics.fmean(v), "p50_s": _pct(v, 50), "p99_s": _pct(v, 99)}
                                      if v else None)
    out["requests"] = requests
    return out


def _pct(v: list[float], p: float) -> float:
    """The p-th percentile of sorted ``v`` (linear interpolation between closest ranks, as numpy's default)."""
    x = (len(v) - 1) * p / 100
    lo = int(x)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (x - lo)


def _compare_answers(out: list[dict[str, Any]], temperature: float) -> None:
    """Greedy only: each record's ``same_text`` = answers identical to the first endpoint's at the smallest C."""
    from ..sampling import is_greedy_temperature

    if not out or not is_greedy_temperature(temperature):
        return
    ref = [r["text"] for r in out[0]["requests"]]
    for rec in out:
        rec["same_text"] = sum(1 for a, b in zip(ref, (r["text"] for r in rec["requests"])) if a == b)
    out[0]["reference"] = True


def serving_table(load: list[dict[str, Any]]) -> list[str]:
    """report.md lines: per endpoint and C, throughput, TTFT and TPOT (mean / p50 / p99), τ, failures, answers."""
    def fmt(v, f, scale=1.0):
        return "—" if v is None else format(v * scale, f)
    lines = ["| endpoint | C | throughput tok/s | TTFT mean / p50 / p99 s | TPOT mean / p50 / p99 ms | τ | failed | "
             "empty | same answers |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(load, key=lambda r: (r["concurrency"], [x["endpoint"] for x in load].index(r["endpoint"]))):
        ttft, tpot = r["ttft"] or {}, r["tpot"] or {}
        n = len(r["requests"])
        same = f"{r['same_text']}/{n}" + (" (reference)" if r.get("reference") else "") if "same_text" in r else "—"
        lines.append(
            f"| {r['endpoint']} | {r['concurrency']} | {r['throughput']:.1f} | "
            f"{' / '.join(fmt(ttft.get(k), '.2f') for k in ('mean_s', 'p50_s', 'p99_s'))} | "
            f"{' / '.join(fmt(tpot.get(k), '.1f', 1e3) for k in ('mean_s', 'p50_s', 'p99_s'))} | "
            f"{fmt(r['tau'], '.2f')} | {r['failed']} | {r.get('empty', 0)} | {same} |")
    return lines


def write_serving_plots(load: list[dict[str, Any]], out: Any) -> list[str]:
    """``serving.png``: throughput, TTFT p50 and TPOT p50 against concurrency, a line per endpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    endpoints = list(dict.fromkeys(r["endpoint"] for r in load))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = (("throughput (tokens/s)", lambda r: r["throughput"]),
              ("TTFT p50 (s)", lambda r: (r["ttft"] or {}).get("p50_s")),
              ("TPOT p50 (ms)", lambda r: None if not r["tpot"] else r["tpot"]["p50_s"] * 1e3))
    for ax, (label, get) in zip(axes, panels):
        for e in endpoints:
            pts = sorted((r["concurrency"], get(r)) for r in load if r["endpoint"] == e and get(r) is not None)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=e)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(label)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(label.split(" (")[0] + " by concurrency")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "serving.png", dpi=120)
    plt.close(fig)
    return ["serving.png"]
