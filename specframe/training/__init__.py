"""Training recipes for learned proposers (``specframe train medusa|draft``).

``corpus``: self-distillation data (prompts built from text the Python standard library ships, answered by the
target itself); ``draft``: a small draft model sharing the target's embeddings; ``medusa``: Medusa-1 heads.
"""
