"""``retrieval``: retrieval-based drafting from a datastore (He et al. 2024, "REST: Retrieval-Based Speculative
Decoding").

Each step the last committed tokens (longest suffix first, from ``max_suffix`` down to ``min_suffix``) are
looked up in a suffix-array datastore (:mod:`specframe.datastore`); the continuations that followed up to
``max_occurrences`` of their occurrences are merged into a trie (shared prefixes once), each node weighted by
how many continuations pass through it, and the ``max_nodes`` heaviest nodes become the draft tree (REST's
"select the most frequent prefixes"), verified in one target forward. Drafts are deterministic (one-hot q), so
exactness holds under greedy decoding and sampling alike. On a target that cannot take tree masks
(sliding-window attention) the draft is the single most frequent chain.

Confidence for a merge policy: :meth:`RetrievalProposer.node_confidence` gives, for each node of the latest
draft, the fraction of retrieved continuations that pass through it (an empirical P(path | suffix)).

Worked example (``max_nodes=4``)::

    continuations [[5, 6, 7], [5, 6, 8], [5, 9], [4]]
    trie counts   5:3  5-6:2  5-6-7:1  5-6-8:1  5-9:1  4:1
    draft         tokens [5, 6, 4, 9], parent [-1, 0, -1, 0], counts [3, 2, 1, 1]   (ties: shallower first)

Datastore: ``datastore: DIR`` (from ``specframe datastore build``), or by default the ``pydoc`` preset (the
Python reference manual topics shipped with CPython, PSF-2.0) tokenized with the target's tokenizer, built once
into ``$SPECFRAME_CACHE/datastores/``.
"""

from __future__ import annotations

from typing import Literal, Optional, Sequence

from pydantic import Field, model_validator

from specframe import (
    ConfigError,
    DecodeState,
    DraftTree,
    ProposerBase,
    ProposerConfig,
    TargetInfo,
    hookimpl,
)
from specframe.services import (
    Datastore,
    DatastoreError,
    Retrieval,
    TokenTrie,
)


class RetrievalConfig(ProposerConfig):
    name: Literal["retrieval"] = "retrieval"
    datastore: Optional[str] = Field(
        None, description="Datastore folder (specframe datastore build); default: the pydoc datastore, built once."
    )
    max_suffix: int = Field(16, ge=1, le=64, description="Longest context suffix looked up (tried first).")
    min_suffix: int = Field(2, ge=1, le=64, description="Shortest context suffix looked up.")
    max_occurrences: int = Field(64, ge=1, le=4096, description="Most occurrences whose continuations are merged.")
    max_nodes: int = Field(16, ge=1, le=256, description="Most draft-tree nodes per step (the verification width).")
    max_depth: int = Field(8, ge=1, le=64, description="Most tokens per continuation (the tree's depth).")

    @model_validator(mode="after")
    def _order(self) -> "RetrievalConfig":
        if self.min_suffix > self.max_suffix:
            raise ValueError(f"retrieval: min_suffix ({self.min_suffix}) must be <= max_suffix ({self.max_suffix})")
        return self


def _trie(continuations: Sequence[Sequence[int]], max_depth: int) -> TokenTrie:
    """``continuations``, each cut to ``max_depth`` tokens, merged by shared prefix (no node budget)."""
    trie = TokenTrie()
    for seq in continuations:
        trie.add(seq[:max_depth])
    return trie


def build_tree(continuations: Sequence[Sequence[int]], max_nodes: int, max_depth: int
               ) -> tuple[list[int], list[int], list[int]]:
    """The ``max_nodes`` heaviest trie nodes of ``continuations`` as a draft tree.

    Args:
        continuations: ``[M][*]`` token-id sequences (each cut to ``max_depth``).
        max_nodes: node budget.
        max_depth: deepest node.

    Returns:
        ``(token_ids [N], parent [N], counts [N])`` in topological order (``parent[i] < i``, -1 = root's child),
        sorted by count (descending), then depth, then first appearance. A child's count never exceeds its
        parent's and it is deeper, so the parent always sorts first and every prefix of this order is a tree.
        See the module docstring for an example.
    """
    trie = _trie(continuations, max_depth)
    order = sorted(range(len(trie.token)), key=lambda i: (-trie.count[i], trie.depth[i], i))[:max_nodes]
    new = {old: j for j, old in enumerate(order)}
    parent = [new[trie.parent[i]] if trie.parent[i] >= 0 else -1 for i in order]
    return [trie.token[i] for i in order], parent, [trie.count[i] for i in order]


def most_frequent_chain(continuations: Sequence[Sequence[int]], max_len: int) -> tuple[list[int], list[int]]:
    """The path that takes the most frequent child at every step (ties: the first seen), up to ``max_len``.

    Returns:
        ``(token_ids [K], counts [K])``. Example: ``most_frequent_chain([[5, 6, 7], [5, 6, 8], [5, 9]], 8)``
        is ``([5, 6, 7], [3, 2, 1])``.
    """
    trie = _trie(continuations, max_len)
    tokens: list[int] = []
    counts: list[int] = []
    at = -1
    children = trie.children
    while children[at]:
        at = max(children[at], key=lambda c: trie.count[c])  # max keeps the first of equal counts
        tokens.append(trie.token[at])
        counts.append(trie.count[at])
    return tokens, counts


def open_datastore(config: RetrievalConfig, target: TargetInfo) -> Datastore:
    """The configured datastore, or the default one for the target's tokenizer; checked against the target.

    Raises:
        ConfigError: the datastore cannot be opened, its ids do not fit the target's vocabulary, or it was built
            with another tokenizer; no datastore is set and the target has no tokenizer.
    """
    from specframe.services import tokenizer_info

    info = tokenizer_info(target.tokenizer) if target.tokenizer is not None else None
    try:
        if config.datastore is not None:
            ds = Datastore.open(config.datastore)
        elif info is None:
            raise ConfigError(
                "retrieval: no `datastore` is set and the target has no tokenizer to build the default one with: "
                "build one with `specframe datastore build` and set `datastore: DIR`"
            )
        else:
            from specframe.services import default_datastore

            ds = default_datastore(target.tokenizer, model=target.name, info=info)
    except DatastoreError as exc:
        raise ConfigError(f"retrieval: {exc}") from None
    if ds.max_token_id >= target.vocab_size:
        raise ConfigError(
            f"retrieval: datastore {ds.path} holds token id {ds.max_token_id}, beyond the target's vocabulary "
            f"({target.vocab_size}): build it with the target's tokenizer (specframe datastore build --model ...)"
        )
    if ds.tokenizer_fingerprint and info is not None and info["fingerprint"] != ds.tokenizer_fingerprint:
        raise ConfigError(
            f"retrieval: datastore {ds.path} was built with another tokenizer ({ds.manifest.get('model')!r}) than "
            f"the target's ({target.name!r}): rebuild it with `specframe datastore build --model <the target>`"
        )
    return ds


class RetrievalProposer(ProposerBase):
    """REST: draft trees from a datastore's continuations of the current suffix (see the module docstring)."""

    name = "retrieval"
    Config = RetrievalConfig
    produces_trees = True
    provides_draft_probs = False

    def __init__(self, config: RetrievalConfig, target: TargetInfo) -> None:
        super().__init__(config, target)
        self.datastore = open_datastore(config, target)
        self.last_retrieval: Retrieval | None = None  # what the latest propose() found (for inspection)
        self._confidence: list[float] = []

    def node_confidence(self) -> list[float]:
        """Confidence of each node of the latest draft, aligned with its nodes (node ``i`` <-> entry ``i``).

        The fraction of the retrieved continuations whose path passes through the node: an empirical estimate of
        P(the node's path follows | the matched suffix), in (0, 1], never above its parent's. Empty after an
        empty draft. The engine may keep only a prefix of the draft (the budget); the prefix of this list then
        still lines up.
        """
        return list(self._confidence)

    def propose(self, state: DecodeState, budget: int) -> DraftTree:
        cfg = self.config
        depth = min(cfg.max_depth, budget)
        tokens = state.tokens[0, -cfg.max_suffix :].tolist()
        found = self.datastore.retrieve(tokens, max_suffix=cfg.max_suffix, min_suffix=cfg.min_suffix,
                                        max_occurrences=cfg.max_occurrences, max_depth=depth)
        self.last_retrieval = found
        if not found.continuations:
            self._confidence = []
            return DraftTree.empty(state.tokens.shape[0])
        nodes = min(cfg.max_nodes, budget)
        if self.target.supports_trees:
            ids, parent, counts = build_tree(found.continuations, nodes, depth)
        else:
            ids, counts = most_frequent_chain(found.continuations, min(depth, nodes))
            parent = list(range(-1, len(ids) - 1))
        total = len(found.continuations)
        self._confidence = [c / total for c in counts]
        return DraftTree.from_lists(ids, parent)


@hookimpl
def specframe_register_proposers(register) -> None:
    register(RetrievalProposer)
