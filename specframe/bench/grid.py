"""Grids of strategy settings: one strategy with ``grid:`` becomes one strategy per combination of values (the
cartesian product), each named after its values and carrying them as ``grid_point``.

Keys name what to vary:

- ``<proposer>.<option>``: an option of one of the strategy's proposers, by its label (its name; ``name#2`` for the
  second proposer of the same name), e.g. ``ngram.k``;
- ``merge.<option>``: the merge policy's (e.g. ``merge.max_nodes``; the policy is ``priority`` unless set);
- ``router.<option>``: the router's (e.g. ``router.free_cost``; the router is ``adaptive`` unless set);
- ``synthetic.<option>``: the strategy's synthetic acceptance (``synthetic.acceptance_length``; a strategy with a
  ``synthetic:`` section). Combinations whose acceptance length exceeds the draft length + 1 cannot be run and are
  left out, so a sweep ``synthetic.acceptance_length: [1, 2, 3, 4, 5]`` × ``synthetic.k: [1, 2, 4, 8, 16]`` (with the
  ``synthetic`` proposer, whose ``k`` follows ``synthetic.k``) is the machine's speed surface.

Example::

    - name: ngram
      proposers: [ngram]
      grid: {ngram.k: [2, 4, 8], ngram.max_n: [2, 3, 4]}      # 9 strategies: "ngram k=2 max_n=2", ...

Option values are checked by the plugins' config models like any other strategy's.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from ..contracts.combining import merge_key


def _label_options(proposers: list[dict[str, Any]]) -> dict[str, int]:
    from ..decode.engine import proposer_labels

    return {label: i for i, label in enumerate(proposer_labels([p["name"] for p in proposers]))}


def expand(strategy: Any) -> list[Any]:
    """The strategies of ``strategy``'s grid (``[strategy]`` when it has none).

    Raises:
        ValueError: a key that names no proposer of the strategy, nor ``merge`` / ``router``; a value that is not a
            non-empty list; a grid on a peer.
    """
    grid = strategy.grid
    if not grid:
        return [strategy]
    if strategy.proposers is None:
        raise ValueError(f"strategy {strategy.name!r}: grid varies specframe proposers' settings, not a peer's")
    labels = _label_options(strategy.proposers)
    for key, values in grid.items():
        head, _, option = key.partition(".")
        if head == "synthetic" and strategy.synthetic is None and head not in labels:
            raise ValueError(f"strategy {strategy.name!r}: grid key {key!r} varies a synthetic acceptance: give the "
                             "strategy a `synthetic:` section")
        if not option or (head not in labels and head not in ("merge", "router", "synthetic")):
            raise ValueError(f"strategy {strategy.name!r}: grid key {key!r} must be <proposer>.<option> for one of its "
                             f"proposers ({', '.join(labels)}), merge.<option>, router.<option> or synthetic.<option>")
        if not isinstance(values, list) or not values:
            raise ValueError(f"strategy {strategy.name!r}: grid.{key} must be a non-empty list of values")
    out = []
    short = len(labels) == 1  # one proposer: "k=4" rather than "ngram.k=4"
    for combo in itertools.product(*grid.values()):
        point = dict(zip(grid, combo))
        proposers = copy.deepcopy(strategy.proposers)
        merge = merge_key(_as_dict(strategy.merge, "name", "priority"))
        router = _as_dict(strategy.router, "name", "adaptive")
        synthetic = strategy.synthetic.model_dump(exclude_none=True) if strategy.synthetic is not None else None
        for key, value in point.items():
            head, _, option = key.partition(".")
            if head == "merge":
                merge[option] = value
            elif head == "router":
                router[option] = value
            elif head == "synthetic" and synthetic is not None:
                synthetic[option] = value
                if option == "k" and "synthetic" in labels:  # the synthetic drafter drafts what the acceptance spans
                    proposers[labels["synthetic"]]["k"] = value
            else:
                proposers[labels[head]][option] = value
        if synthetic is not None:
            synthetic = type(strategy.synthetic).model_validate(synthetic)
            if synthetic.acceptance_length is not None and synthetic.acceptance_length > _k(synthetic, proposers) + 1:
                continue  # (more tokens a step than the draft has: no such point)
        uses = {key.partition(".")[0] for key in point}
        name = " ".join([strategy.name] + [f"{k.partition('.')[2] if short and k.partition('.')[0] in labels else k}={v}"
                                           for k, v in point.items()])
        out.append(strategy.model_copy(update={
            "name": name, "proposers": proposers, "grid": None, "grid_point": point, "grid_of": strategy.name,
            "merge": merge if "merge" in uses else strategy.merge,
            "router": router if "router" in uses else strategy.router,
            "synthetic": synthetic,
        }))
    return out


def _k(synthetic: Any, proposers: list[dict[str, Any]]) -> int:
    ks = [p.get("k") for p in proposers if isinstance(p.get("k"), int)]
    return synthetic.k if synthetic.k is not None else max(ks, default=1 << 30)


def _as_dict(value: Any, key: str, default: str) -> dict[str, Any]:
    if value is None:
        return {key: default}
    if isinstance(value, str):
        return {key: value}
    return dict(value)
