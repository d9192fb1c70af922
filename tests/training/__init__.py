"""The training recipes (medusa, eagle, draft model, DFlash, PARD), the self-distillation corpus and the retrieval
datastore: what builds a proposer's weights or data, apart from the proposers themselves (tests/proposers)."""
