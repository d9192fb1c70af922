"""The target floor: one folder per engine behind the target contract (``hf``: any transformers causal LM, the
exactness reference; ``llamacpp``: GGUF through llama.cpp), model names and loading, the machine and its profile,
and ``cost``, the one owner of the verification cost curve v(n)."""
