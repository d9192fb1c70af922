"""Proposers one by one (ngram, lookahead, self-drafting, draft-model, cross-draft, medusa, eagle, mtp, retrieval,
published drafter layouts, block drafters); the recipes that train their weights and the datastore are in tests/training."""
