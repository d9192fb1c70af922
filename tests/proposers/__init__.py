"""Proposers one by one (ngram, lookahead, self-drafting, draft-model, cross-draft, medusa, eagle, mtp, retrieval and its
datastore, published drafter layouts) and the recipes that train their weights."""
