"""Learned draft components shared by proposers and their training recipes: Medusa heads
(:mod:`.medusa_heads`) and small draft models that share the target's embeddings (:mod:`.small_draft`)."""
