"""Host syncs per decoding step, per drafting strategy (issue 69): a table to compare before and after a change.

    .venv/bin/python scripts/host_sync_census.py                 # the table (markdown) on stdout
    .venv/bin/python scripts/host_sync_census.py --sites 8       # and each strategy's 8 busiest call sites
    SPECFRAME_TEST_DEVICE=cuda .venv/bin/python scripts/host_sync_census.py   # the same on a GPU (device-run rule)

One greedy request per strategy (and one sampled EAGLE chain) on the tests' tiny random models (tests/fakes.py: a
4-layer Llama over a 64-word vocabulary; the byte-level BPE model for the JSON-schema constraint), stepped with the
public :class:`~specframe.decode.engine.Request` API. Every step is counted with
:func:`specframe.testing.host_syncs.count_host_syncs` (see its module docstring for what counts as a sync, and the
rule for host-to-device copies on a CPU-only run), split into ``draft`` (``Request.draft``: the proposers, merging,
the constraint's cut), of which ``propose`` (the proposers' own ``propose``), and ``verify`` (``Request.verify``:
the verification batch, the target forward, acceptance, the KV-cache rollback, feedback). The prefill
(``Request.start``) is not counted. ``out`` is a hash of the generated token ids: it must not change between
before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specframe.acceptance import GreedyVerifier, SpeculativeSamplingVerifier  # noqa: E402
from specframe.decode.engine import Engine  # noqa: E402
from specframe.sampling import SamplingParams  # noqa: E402
from specframe.testing.host_syncs import HostSyncs, count_host_syncs, per_step  # noqa: E402

from tests.fakes import (  # noqa: E402
    BPE_EOS,
    NAME,
    PROMPT,
    build_bpe_model,
    build_bpe_tokenizer,
    build_model,
    build_tokenizer,
    draft_dir,
    policy_of,
    random_drafter,
    random_heads,
)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                    "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def _hash(ids: list[int]) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:8]


class Census:
    """One strategy's counts: whole steps, their draft and verify halves, and the proposers' ``propose``."""

    def __init__(self) -> None:
        self.step, self.draft, self.verify, self.propose = HostSyncs(), HostSyncs(), HostSyncs(), HostSyncs()
        self.steps = 0

    @staticmethod
    def _merge(into: HostSyncs, part: HostSyncs) -> None:
        for kind, n in part.by_kind.items():
            into.by_kind[kind] = into.by_kind.get(kind, 0) + n
        into.sites.update(part.sites)


def census(engine: Engine, prompt: list[int], max_new: int, sites: bool, **request: Any) -> tuple[Census, list[int]]:
    c = Census()
    for p in engine.proposers:
        orig = p.propose

        def counted(state, budget, _orig=orig):
            with count_host_syncs(sites=sites) as s:
                out = _orig(state, budget)
            Census._merge(c.propose, s)
            return out

        p.propose = counted
    req = engine.request(prompt, max_new_tokens=max_new, **request)
    try:
        with torch.inference_mode():
            req.start()
            while not req.finished:
                with count_host_syncs(sites=sites) as s_step:
                    with count_host_syncs(sites=sites) as s_draft:
                        drafted = req.draft()
                    with count_host_syncs(sites=sites) as s_verify:
                        req.verify(*drafted)
                for into, part in ((c.step, s_step), (c.draft, s_draft), (c.verify, s_verify)):
                    Census._merge(into, part)
                c.steps += 1
            result = req.result()
    finally:
        req.close()
    return c, list(result.token_ids)


def strategies(tmp: Path) -> dict[str, Callable[[], tuple[Engine, list[int], dict]]]:
    from specframe.contracts.constraint import ConstraintSpec
    from specframe.grammar.llguidance_engine import LLGuidanceEngine
    from specframe.target.hf import Target
    from specframe_plugins.autoregressive import NoneConfig, NoProposer
    from specframe_plugins.draft_model import DraftModelConfig, DraftModelProposer
    from specframe_plugins.eagle import EagleConfig, EagleProposer
    from specframe_plugins.lookahead import LookaheadConfig, LookaheadProposer
    from specframe_plugins.medusa import MedusaConfig, MedusaProposer
    from specframe_plugins.ngram import NgramConfig, NgramProposer

    target = Target(build_model("llama", num_hidden_layers=4), build_tokenizer(), name=NAME)
    info = target.info
    eagle_dir = tmp / "eagle"
    random_drafter(target.model, layers=(1, 2, 4)).save(eagle_dir)
    heads_dir = tmp / "medusa"
    random_heads(4, 1, seed=0).save(heads_dir, NAME)
    draft = draft_dir(tmp, "llama")

    def medusa():
        return MedusaProposer(MedusaConfig(heads=str(heads_dir), top_k=3, max_nodes=8), info)

    def eagle(**kw):
        return EagleProposer(EagleConfig(weights=str(eagle_dir), **kw), info)

    def plain(proposers, merge=None, verifier=None):
        return Engine(target, proposers, verifier or GreedyVerifier(), merge=merge)

    def constrained():
        tok = build_bpe_tokenizer()
        model = build_bpe_model(tok)
        bpe = Target(model, tok, name=NAME)
        c = LLGuidanceEngine(tok, model.config.vocab_size, {BPE_EOS}).compile(ConstraintSpec(json_schema=PERSON))
        prompt = tok.encode('{"name": "Ada", "age": 36, "tags": ["x"]} {"name": "Ada", "age"')
        return Engine(bpe, [NgramProposer(NgramConfig(), bpe.info)], GreedyVerifier()), prompt, {"constraint": c}

    return {
        "none (no draft)": lambda: (plain([NoProposer(NoneConfig(), info)]), PROMPT, {}),
        "ngram": lambda: (plain([NgramProposer(NgramConfig(), info)]), PROMPT, {}),
        "lookahead": lambda: (plain([LookaheadProposer(LookaheadConfig(), info)]), PROMPT, {}),
        "medusa (tree)": lambda: (plain([medusa()]), PROMPT, {}),
        "eagle (tree)": lambda: (plain([eagle()]), PROMPT, {}),
        "eagle (sampled chain)": lambda: (plain([eagle()], verifier=SpeculativeSamplingVerifier()), PROMPT,
                                          {"sampling": SamplingParams(temperature=1.0), "seed": 3}),
        "draft-model": lambda: (plain([DraftModelProposer(DraftModelConfig(model=str(draft)), info)]), PROMPT, {}),
        "ngram+medusa": lambda: (plain([NgramProposer(NgramConfig(), info), medusa()], merge=policy_of("priority")),
                                 PROMPT, {}),
        "ngram + json_schema": constrained,
    }


def row(name: str, c: Census, out: list[int]) -> str:
    s = max(c.steps, 1)
    kinds = per_step(c.step, s)
    total = kinds.pop("total")
    by_kind = ", ".join(f"{k} {v:.2f}" for k, v in kinds.items())
    return (f"| {name} | {c.steps} | {len(out)} | {total:.2f} | {per_step(c.draft, s)['total']:.2f} | "
            f"{per_step(c.propose, s)['total']:.2f} | {per_step(c.verify, s)['total']:.2f} | {by_kind} | "
            f"{_hash(out)} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--only", action="append", help="run only this strategy (repeatable)")
    ap.add_argument("--sites", type=int, default=0, help="also list each strategy's N busiest call sites")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| strategy | steps | tokens | syncs/step | draft | (propose) | verify | by kind, per step | out |",
             "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in strategies(Path(tmp)).items():
            if args.only and name not in args.only:
                continue
            engine, prompt, request = build()
            c, out = census(engine, prompt, args.max_new_tokens, args.sites > 0, **request)
            lines.append(row(name, c, out))
            if args.sites:
                notes.append(f"\n{name}: busiest sites (calls over {c.steps} steps)")
                for (kind, site), n in c.step.sites.most_common(args.sites):
                    notes.append(f"  {n:5d}  {kind:8s} {site.replace(str(ROOT) + '/', '')}")
    print("\n".join(lines + notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
