"""specframe.token_tree.TokenTrie (insertion order, dedup, node budget, counts/depths, non-mergeable nodes) and
DraftTree.from_lists (shapes, dtypes, errors)."""

from __future__ import annotations

import pytest
import torch

from specframe.contracts import DraftTree
from specframe.token_tree import TokenTrie


def test_docstring_example():
    trie = TokenTrie(max_nodes=4)
    assert trie.add([1, 2, 3]) == [0, 1, 2]
    assert trie.add([1, 4, 5]) == [0, 3]  # 1 shared, 4 new, then the budget is spent
    assert (trie.token, trie.parent) == ([1, 2, 3, 4], [-1, 0, 1, 0])
    assert (trie.count, trie.depth) == ([2, 1, 1, 1], [1, 2, 3, 2])
    assert len(trie) == 4 and trie.full


def test_insertion_order_dedup_counts_depths_children():
    trie = TokenTrie()
    trie.add([5, 6, 7])
    trie.add([5, 6, 8])
    trie.add([5, 9])
    trie.add([4])
    assert trie.token == [5, 6, 7, 8, 9, 4]
    assert trie.parent == [-1, 0, 1, 1, 0, -1]
    assert trie.depth == [1, 2, 3, 3, 2, 1]
    assert trie.count == [3, 2, 1, 1, 1, 1]
    assert trie.children == {-1: [0, 5], 0: [1, 4], 1: [2, 3], 2: [], 3: [], 4: [], 5: []}
    assert trie.child(-1, 5) == 0 and trie.child(1, 8) == 3 and trie.child(0, 7) is None
    assert not trie.full


def test_same_token_under_different_parents_is_two_nodes():
    trie = TokenTrie()
    trie.add([1, 1, 1])
    assert trie.token == [1, 1, 1] and trie.parent == [-1, 0, 1]
    assert trie.insert(-1, 1) == 0 and trie.insert(2, 1) == 3
    assert trie.count == [2, 1, 1, 1]


def test_max_nodes_caps_new_nodes_but_not_duplicates():
    trie = TokenTrie(max_nodes=3)
    assert trie.add([1, 2, 3, 4]) == [0, 1, 2]  # the 4th token would be a 4th node
    assert trie.add([5]) == []  # a new root child: none left
    assert trie.add([1, 2, 3]) == [0, 1, 2]  # duplicates cost nothing
    assert trie.insert(2, 4) is None
    assert trie.token == [1, 2, 3] and trie.count == [2, 2, 2]
    assert TokenTrie(max_nodes=0).add([1]) == []


def test_a_sequence_stops_at_the_budget_and_the_next_one_still_merges():
    trie = TokenTrie(max_nodes=4)
    trie.add([1, 2, 3])
    trie.add([7, 8, 9])  # 7 fits, 8 does not
    trie.add([1, 2, 6])  # shares 1, 2; 6 does not fit
    assert trie.token == [1, 2, 3, 7] and trie.parent == [-1, 0, 1, -1]
    assert trie.count == [2, 2, 1, 1]


def test_non_mergeable_nodes_are_never_shared():
    trie = TokenTrie()
    assert trie.insert(-1, 3) == 0
    assert trie.insert(-1, 3, mergeable=False) == 1  # a new sibling with the same token
    assert trie.insert(-1, 3, mergeable=False) == 2
    assert trie.insert(-1, 3) == 0  # a mergeable insertion finds only the mergeable node
    assert trie.add([4, 5], parent=1, mergeable=False) == [3, 4]
    assert trie.add([4, 5], parent=1, mergeable=False) == [5, 6]
    assert trie.child(1, 4) is None
    assert trie.token == [3, 3, 3, 4, 5, 4, 5] and trie.parent == [-1, -1, -1, 1, 3, 1, 5]
    assert trie.count == [2, 1, 1, 1, 1, 1, 1] and trie.depth == [1, 1, 1, 2, 3, 2, 3]
    # a non-mergeable node is not indexed: a mergeable insertion after it makes its own node
    fresh = TokenTrie()
    fresh.insert(-1, 8, mergeable=False)
    assert fresh.insert(-1, 8) == 1 and fresh.insert(-1, 8) == 1


def test_tokens_are_stored_as_python_ints():
    trie = TokenTrie()
    trie.add(torch.tensor([3, 4]))
    assert trie.token == [3, 4] and all(type(t) is int for t in trie.token)
    assert trie.insert(0, torch.tensor(4)) == 1


def test_insert_rejects_an_unknown_parent():
    trie = TokenTrie()
    with pytest.raises(IndexError):
        trie.insert(0, 1)
    trie.insert(-1, 1)
    with pytest.raises(IndexError):
        trie.insert(-2, 1)


def test_to_draft():
    trie = TokenTrie()
    trie.add([1, 2])
    trie.add([1, 3])
    d = trie.to_draft()
    assert d.token_ids.tolist() == [[1, 2, 3]] and d.parent.tolist() == [[-1, 0, 0]]
    assert d.draft_probs is None
    q = torch.rand(3, 10)
    assert torch.equal(trie.to_draft(q).draft_probs, q[None])
    empty = TokenTrie().to_draft()
    assert empty.token_ids.shape == (1, 0) and empty.parent.shape == (1, 0)


def test_from_lists_shapes_and_dtypes():
    d = DraftTree.from_lists([5, 6, 7], [-1, 0, 0])
    assert d.token_ids.shape == (1, 3) and d.parent.shape == (1, 3)
    assert d.token_ids.dtype == torch.int64 and d.parent.dtype == torch.int64
    assert d.token_ids.tolist() == [[5, 6, 7]] and d.parent.tolist() == [[-1, 0, 0]]
    assert d.draft_probs is None and d.num_nodes == 3
    q = torch.rand(3, 11)
    assert DraftTree.from_lists([5, 6, 7], [-1, 0, 0], q).draft_probs.shape == (1, 3, 11)
    assert torch.equal(DraftTree.from_lists([5, 6, 7], [-1, 0, 0], q[None]).draft_probs, q[None])
    e = DraftTree.from_lists([], [])
    assert e.token_ids.shape == (1, 0) and e.parent.shape == (1, 0) and e.token_ids.dtype == torch.int64
    assert DraftTree.from_lists([], [], torch.zeros(0, 4)).draft_probs.shape == (1, 0, 4)


def test_from_lists_equals_the_tensor_construction():
    ids, parents = [4, 9, 2, 2], [-1, 0, 0, 1]
    d = DraftTree.from_lists(ids, parents)
    assert torch.equal(d.token_ids, torch.tensor([ids], dtype=torch.int64))
    assert torch.equal(d.parent, torch.tensor([parents], dtype=torch.int64))
    chain = DraftTree.chain([4, 9, 2])
    same = DraftTree.from_lists([4, 9, 2], [-1, 0, 1])
    assert torch.equal(chain.token_ids, same.token_ids) and torch.equal(chain.parent, same.parent)


def test_from_lists_errors():
    with pytest.raises(ValueError, match="3 token ids but 2 parents"):
        DraftTree.from_lists([1, 2, 3], [-1, 0])
    with pytest.raises(ValueError, match="draft_probs"):
        DraftTree.from_lists([1, 2], [-1, 0], torch.rand(3, 5))  # N mismatch
    with pytest.raises(ValueError, match="draft_probs"):
        DraftTree.from_lists([1, 2], [-1, 0], torch.rand(2, 2, 5))  # batch of 2
    with pytest.raises(ValueError, match="draft_probs"):
        DraftTree.from_lists([1, 2], [-1, 0], torch.rand(10))  # no vocabulary axis
