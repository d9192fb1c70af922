"""Every decoder type of the installed transformers as a specframe target: exact, or refused in one line.

For one model type (:func:`check_type`): the tiny random model of :mod:`specframe.testing.decoder_types` (float32),
transformers' own greedy ``generate`` as the reference, then specframe's engine under each proposer that needs no
trained weights (:data:`PROPOSERS`; ``retrieval`` over a datastore of the reference itself), greedy, ``router`` off. Each cell of the row is one of

- ``exact``: token-identical to the reference, and the proposer never raised (a raise is a lost draft, counted in
  ``proposer_faults``);
- ``refused: <message>``: specframe said no in one :class:`~specframe.errors.SpecframeError` (a target it cannot
  roll back; a proposer the model cannot serve);
- ``diverged at token i``: a silent wrong token (an exactness breach);
- ``faults N``: exact output, but the proposer raised (its drafts were lost);
- ``error: <type>: <first line>``: an exception that is not a SpecframeError (a traceback for a user).

A type transformers itself cannot build or generate with is ``unbuildable`` (not specframe's to judge).
``python scripts/decoder_sweep.py`` writes the table; ``tests/target/test_decoder_sweep.py`` asserts it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..acceptance import GreedyVerifier
from ..decode.engine import Engine
from ..errors import SpecframeError, first_line
from ..target.hf import Target
from ..target.state_target import make_target
from .decoder_types import buildable, family, reference_greedy

PROPOSERS = ("none", "ngram", "lookahead", "layer-skip", "early-exit", "retrieval")
PROMPT = [5, 9, 12, 7, 5, 9, 12, 30, 41, 5, 9, 12, 7, 18, 5, 9]  # repeated n-grams: ngram drafts from step 1


def _proposer(name: str, info: Any, reference: list[int] | None = None, workdir: Path | None = None) -> Any:
    """A proposer by name on ``info``'s target; ``retrieval`` gets a datastore in ``workdir`` of two documents: the
    prompt followed by ``reference`` (its drafts are accepted), and by ``reference`` reversed (a second branch)."""
    from specframe_plugins.autoregressive import NoneConfig, NoProposer
    from specframe_plugins.lookahead import LookaheadConfig, LookaheadProposer
    from specframe_plugins.ngram import NgramConfig, NgramProposer
    from specframe_plugins.self_draft import EarlyExitConfig, EarlyExitProposer, LayerSkipConfig, LayerSkipProposer

    make: dict[str, Callable[[], Any]] = {
        "none": lambda: NoProposer(NoneConfig(), info),
        "ngram": lambda: NgramProposer(NgramConfig(), info),
        "lookahead": lambda: LookaheadProposer(LookaheadConfig(), info),
        "layer-skip": lambda: LayerSkipProposer(LayerSkipConfig(skip=[1], k=3), info),
        "early-exit": lambda: EarlyExitProposer(EarlyExitConfig(exit_layer=1, k=3), info),
        "retrieval": lambda: _retrieval(info, reference or [], workdir or Path(tempfile.mkdtemp())),
    }
    return make[name]()


def _retrieval(info: Any, reference: list[int], workdir: Path) -> Any:
    from specframe.datastore.store import build_datastore
    from specframe_plugins.retrieval import RetrievalConfig, RetrievalProposer

    folder = workdir / "datastore"
    build_datastore([PROMPT + reference, PROMPT + reference[::-1]], folder, vocab_size=info.vocab_size, force=True)
    return RetrievalProposer(RetrievalConfig(datastore=str(folder)), info)


def _one_line(exc: BaseException) -> str:
    return first_line(exc) or type(exc).__name__


@dataclass
class SweepRow:
    """One model type's results: ``cells`` maps a proposer name to its verdict (see the module docstring)."""

    model_type: str
    family: str = ""
    status: str = ""  # exact | refused | unbuildable | broken
    reason: str = ""  # the refusal (whole type) or why transformers cannot build it
    cells: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No traceback, no divergence, no lost drafts."""
        return self.status in ("exact", "refused", "unbuildable")


@torch.inference_mode()
def _run(target: Target, name: str, reference: list[int]) -> str:
    with tempfile.TemporaryDirectory() as work:
        return _run_in(target, name, reference, Path(work))


def _run_in(target: Target, name: str, reference: list[int], work: Path) -> str:
    try:
        proposer = _proposer(name, target.info, reference, work)
    except SpecframeError as exc:
        return f"refused: {_one_line(exc)}"
    engine = Engine(target, [proposer], GreedyVerifier())
    try:
        result = engine.generate(PROMPT, max_new_tokens=len(reference))
    except SpecframeError as exc:
        return f"refused: {_one_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - the sweep reports what a user would see as a traceback
        return f"error: {type(exc).__name__}: {_one_line(exc)}"
    out = list(result.token_ids)
    if out != reference:
        first = next((i for i, (a, b) in enumerate(zip(out, reference)) if a != b), min(len(out), len(reference)))
        return f"diverged at token {first}"
    faults = result.metrics.proposer_faults
    return f"faults {faults}" if faults else "exact"


def check_type(model_type: str, tokens: int = 16, proposers: tuple[str, ...] = PROPOSERS) -> SweepRow:
    """Sweep one model type (see the module docstring); ``tokens`` new tokens per run."""
    row = SweepRow(model_type)
    model, why = buildable(model_type)
    if model is None:
        row.status, row.reason = "unbuildable", why
        return row
    row.family = family(model_type, model.config)
    reference = reference_greedy(model, PROMPT, tokens)
    try:
        target = make_target(model, None, name=model_type)
    except SpecframeError as exc:
        row.status, row.reason = "refused", _one_line(exc)
        return row
    except Exception as exc:  # noqa: BLE001
        row.status, row.reason = "broken", f"error: {type(exc).__name__}: {_one_line(exc)}"
        return row
    for name in proposers:
        row.cells[name] = _run(target, name, reference)
    good = all(c == "exact" or c.startswith("refused") for c in row.cells.values())
    row.status = "exact" if good else "broken"
    return row
