"""What rolling back a hybrid target's recurrent state costs, per verification step, two ways (issue 52 c).

    python lab/scripts/recurrent_rollback_cost.py [--layers 24] [--hidden 1024] [--repeats 5] [--out DIR]

The target is a Qwen3.5-like hybrid with random weights of a realistic shape (``qwen3_5_text``: 3 gated-delta
linear-attention layers to 1 full-attention layer, 24 layers, hidden 1024, vocabulary 32 768; float32, every core),
after a 256-token prompt. For a draft of k tokens (a forward over w = k + 1 positions) and a accepted drafts:

- ``chunked``: the verification forward with no way back (transformers' chunked scan, nothing kept): the floor.
- ``(a) snapshot``: what specframe does (:class:`specframe.target.kv_cache.SpecCache`): the forward keeps the state
  after each of its w positions (the model runs them through its one-token recurrent update), then
  :func:`~specframe.target.kv_cache.rollback` restores the accepted one.
- ``(b) replay``: the state before the step is copied, the forward runs chunked; when a draft is rejected the copy
  is restored and the accepted a + 1 tokens run again through the target (every layer: a generic replay).

Each is timed from the same prefilled cache (a deep copy per repeat, outside the timing), medians over repeats, and
reported as ms and as a fraction of a plain one-token step (transformers' own cache, no recording). Memory is what
each keeps beyond the committed state: (a) the recorded states and the wider convolution window, (b) the copy.
Then end to end, token-identical or not and tok/s: plain decoding (``none``), drafts accepted by construction (an
oracle drafting plain decoding's own next 4 tokens) and ``ngram``.
Run it alone: other processes change the figures more than the strategies do.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from specframe.target.kv_cache import new_cache, recurrent_layers, rollback


def build(layers: int, hidden: int) -> Qwen3_5ForCausalLM:
    kinds = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    cfg = Qwen3_5TextConfig(vocab_size=32768, hidden_size=hidden, intermediate_size=int(hidden * 3.5),
                            num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                            linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
                            linear_value_head_dim=128, layer_types=kinds, max_position_embeddings=4096)
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(cfg).float().eval()


class _Sequential(DynamicCache):
    """Transformers' cache, no recording, but every position after the prefill through the one-token recurrent update
    (what (a) computes, without keeping the states): separates the recording's cost from the sequential update's."""

    def get_recurrent_states_to_keep(self, layer_idx=None) -> int:
        layer = self.layers[layer_idx or 0]
        return 1 << 30 if any(getattr(layer, "is_recurrent_states_initialized", {}).values()) else 0


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _state(cache) -> list:
    out = []
    for layer in recurrent_layers(cache):
        out += list(layer.conv_states.values()) + list(layer.recurrent_states.values())
    return out


def _snapshot(cache):
    return [(layer, {i: t.clone() for i, t in layer.conv_states.items() if t is not None},
             {i: t.clone() for i, t in layer.recurrent_states.items() if t is not None},
             layer.cumulative_length_linear.clone()) for layer in recurrent_layers(cache)]


def _restore(cache, snap, length: int) -> None:
    for layer, conv, rec, count in snap:
        layer.conv_states.update(conv)
        for i, t in rec.items():
            layer.recurrent_states[i].copy_(t)
        layer.cumulative_length_linear = count
        layer.recurrent_states_history = {i: [] for i in range(layer.number_of_states)}
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and hasattr(layer, "keys") and layer.keys is not None:
            extra = layer.keys.shape[-2] - length
            if extra > 0:
                layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length = length


@torch.inference_mode()
def measure(model, repeats: int) -> dict:
    torch.manual_seed(1)
    prompt = torch.randint(1, 32768, (1, 256))
    spec = new_cache(model.config)
    model(input_ids=prompt, cache=spec, use_cache=True, logits_to_keep=1)
    model(input_ids=torch.randint(1, 32768, (1, 9)), cache=spec, use_cache=True)  # as after a step of the engine: the
    rollback(spec, 256)  # cache's state buffers exist (they are reused from step to step), the window is trimmed
    plain = DynamicCache(config=model.config)
    model(input_ids=prompt, cache=plain, use_cache=True, logits_to_keep=1)
    base = 256
    committed = _bytes(_state(spec))

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    one = torch.randint(1, 32768, (1, 1))
    t_plain = statistics.median(
        timed(lambda c=copy.deepcopy(plain): model(input_ids=one, cache=c, use_cache=True)) for _ in range(repeats))
    rows = []
    for k in (1, 2, 4, 8):
        w = k + 1
        block = torch.randint(1, 32768, (1, w))
        for accepted in sorted({0, k // 2, k}):
            keep = base + 1 + accepted
            times: dict[str, list[float]] = {"chunked": [], "sequential": [], "a": [], "b": []}
            mem_a = mem_b = 0
            for _ in range(repeats):  # interleaved: the three ways alternate within each repeat
                c = copy.deepcopy(plain)
                times["chunked"].append(timed(lambda: model(input_ids=block, cache=c, use_cache=True)))
                c = copy.deepcopy(plain)
                c.__class__ = _Sequential
                times["sequential"].append(timed(lambda: model(input_ids=block, cache=c, use_cache=True)))
                c = copy.deepcopy(spec)

                def way_a() -> None:
                    nonlocal mem_a
                    model(input_ids=block, cache=c, use_cache=True)
                    mem_a = sum(_bytes(h) for layer in recurrent_layers(c) for h in layer.recurrent_states_history.values())
                    mem_a += _bytes(_state(c)) - committed
                    rollback(c, keep)
                times["a"].append(timed(way_a))
                c = copy.deepcopy(plain)

                def way_b() -> None:
                    nonlocal mem_b
                    snap = _snapshot(c)
                    mem_b = sum(_bytes(list(conv.values()) + list(rec.values())) for _, conv, rec, _ in snap)
                    model(input_ids=block, cache=c, use_cache=True)
                    if accepted < k:
                        _restore(c, snap, base)
                        model(input_ids=block[:, :accepted + 1], cache=c, use_cache=True)
                times["b"].append(timed(way_b))
            med = {name: statistics.median(v) for name, v in times.items()}
            floor = min(med["chunked"], med["sequential"])  # the cheaper forward with no way back
            rows.append({"k": k, "accepted": accepted, "chunked_ms": med["chunked"],
                         "sequential_ms": med["sequential"], "a_ms": med["a"], "b_ms": med["b"],
                         "a_over_plain": (med["a"] - floor) / t_plain,
                         "b_over_plain": (med["b"] - floor) / t_plain,
                         "a_mib": mem_a / 2**20, "b_mib": mem_b / 2**20})
            print(json.dumps(rows[-1]), flush=True)
    return {"plain_step_ms": t_plain, "committed_state_mib": committed / 2**20, "rows": rows}


def end_to_end(model, tokens: int, k: int = 4) -> dict:
    """Plain decoding vs drafts that are accepted by construction (an oracle drafting the next ``k`` tokens of plain
    decoding's own output) and vs ``ngram``, interleaved, on a prompt that repeats itself."""
    from typing import Literal

    from specframe import DraftTree, ProposerBase, ProposerConfig
    from specframe.acceptance import GreedyVerifier
    from specframe.decode.engine import Engine
    from specframe.target.hf import Target
    from specframe_plugins.autoregressive import NoneConfig, NoProposer
    from specframe_plugins.ngram import NgramConfig, NgramProposer

    target = Target(model)
    torch.manual_seed(2)
    prompt = torch.randint(1, 32768, (24,)).tolist() * 4
    plain = Engine(target, [NoProposer(NoneConfig(), target.info)], GreedyVerifier())
    reference = plain.generate(prompt, max_new_tokens=tokens).token_ids

    class OracleConfig(ProposerConfig):
        name: Literal["oracle"] = "oracle"

    class Oracle(ProposerBase):
        name, Config = "oracle", OracleConfig

        def propose(self, state, budget):
            done = state.tokens.shape[1] - len(prompt)
            return DraftTree.chain(reference[done:done + min(k, budget)])

    engines = {"none": plain, "oracle": Engine(target, [Oracle(OracleConfig(), target.info)], GreedyVerifier()),
               "ngram": Engine(target, [NgramProposer(NgramConfig(), target.info)], GreedyVerifier())}
    out: dict = {}
    for _ in range(2):  # interleaved
        for name, engine in engines.items():
            t0 = time.perf_counter()
            r = engine.generate(prompt, max_new_tokens=tokens)
            dt = time.perf_counter() - t0
            out.setdefault(name, []).append({"tok_s": len(r.token_ids) / dt, "tau": r.metrics.tau,
                                             "identical": r.token_ids == reference})
    return {n: {"tok_s": statistics.median(x["tok_s"] for x in v), "tau": v[0]["tau"],
                "identical": all(x["identical"] for x in v)} for n, v in out.items()}


def scripted(model, cycle: int = 24) -> list[int]:
    """Make ``model`` continue a fixed cycle of ``cycle`` tokens (in place, same shapes and cost): every layer's output
    projections scaled by 0.01 so the residual stream stays near the token's embedding, and the LM head row of
    ``succ(t)`` set to ``t``'s embedding. Returns a prompt of the cycle twice, so ``ngram`` drafts are accepted."""
    torch.manual_seed(3)
    ring = torch.randperm(model.config.vocab_size)[:cycle].tolist()
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb.normal_(0, 1)
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
                p.mul_(0.01)
        head = model.get_output_embeddings().weight
        head.copy_(emb)
        for i, t in enumerate(ring):
            head[ring[(i + 1) % cycle]] = emb[t]
    return ring * 2


def router_end_to_end(model, tokens: int) -> dict:
    """Plain decoding vs ``ngram`` alone and ``ngram`` with the adaptive router, on a target scripted to repeat its
    prompt (drafts accepted by construction), interleaved; through the public API."""
    import specframe
    from specframe.target.hf import Target

    prompt = scripted(model)
    sf = specframe.load(target=Target(model), proposers=["none"])
    runs = {"none": dict(proposers="none"), "ngram": dict(proposers="ngram", router="none"),
            "ngram+router": dict(proposers="ngram", router="adaptive")}
    out: dict = {}
    for _ in range(2):
        for name, kw in runs.items():
            t0 = time.perf_counter()
            r = sf.generate_result(prompt, max_new_tokens=tokens, **kw)
            dt = time.perf_counter() - t0
            out.setdefault(name, []).append({"tok_s": len(r.token_ids) / dt, "tau": r.metrics.tau, "ids": r.token_ids})
    ref = out["none"][0]["ids"]
    return {n: {"tok_s": statistics.median(x["tok_s"] for x in v), "tau": v[0]["tau"],
                "identical": all(x["ids"] == ref for x in v), "repeats_prompt": ref[:len(prompt) // 2] == prompt[:len(prompt) // 2]}
            for n, v in out.items()}


def table(result: dict) -> str:
    """The result as Markdown tables (what ``--out`` writes beside ``result.json`` as ``table.md``)."""
    m = result["machine"]
    lines = [f"Machine: {m['cpu']}, ISA {' '.join(m['isa'])}, {m['threads']} threads. Plain one-token step "
             f"{result['plain_step_ms']:.0f} ms; committed recurrent state {result['committed_state_mib']:.0f} MiB.", "",
             "| k | accepted | chunked ms | sequential ms | (a) ms | (b) ms | (a) extra / plain step | "
             "(b) extra / plain step | (a) MiB | (b) MiB |", "|" + "---:|" * 10]
    for x in result["rows"]:
        lines.append(f"| {x['k']} | {x['accepted']} | {x['chunked_ms']:.0f} | {x['sequential_ms']:.0f} | {x['a_ms']:.0f} "
                     f"| {x['b_ms']:.0f} | {x['a_over_plain']:.2f} | {x['b_over_plain']:.2f} | {x['a_mib']:.0f} "
                     f"| {x['b_mib']:.0f} |")
    for key, title in (("end_to_end", "random weights"), ("router_end_to_end", "scripted to repeat its prompt")):
        runs = result[key]
        lines += ["", f"End to end, {title}:", "", "| run | tok/s | τ | vs none | identical |", "|---|---:|---:|---:|---|"]
        for name, v in runs.items():
            lines.append(f"| {name} | {v['tok_s']:.2f} | {v['tau']:.2f} | {v['tok_s'] / runs['none']['tok_s']:.2f}x "
                         f"| {v['identical']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model = build(args.layers, args.hidden)
    isa = sorted({f for f in Path("/proc/cpuinfo").read_text().split() if f.startswith(("avx512", "amx", "avx2"))})
    result = {"machine": {"cpu": platform.processor() or platform.machine(), "isa": isa,
                          "threads": torch.get_num_threads()},
              "shape": {"layers": args.layers, "hidden": args.hidden, "kinds": "3 linear : 1 full"},
              **measure(model, args.repeats), "end_to_end": end_to_end(model, args.tokens),
              "router_end_to_end": router_end_to_end(model, args.tokens)}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.out / "table.md").write_text(table(result))


if __name__ == "__main__":
    main()
