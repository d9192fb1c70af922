"""The llama.cpp engine: a GGUF on llama.cpp's CPU kernels as the target (docs/llamacpp.md).

- :mod:`~specframe.target.llamacpp.binding`: llama-cpp-python's low-level API (import, build features, context, batch);
- :mod:`~specframe.target.llamacpp.target`: the target and its scorer (the engine's KV invariant on a llama.cpp context);
- :mod:`~specframe.target.llamacpp.profile`: T(n) per thread count on this machine, for the router;
- :mod:`~specframe.target.llamacpp.loader`: GGUF + tokenizer + build check + threads -> a target;
- :mod:`~specframe.target.llamacpp.peers`: llama.cpp's own decoding and prompt lookup as bench peers.

Nothing here is imported unless ``engine: llama.cpp`` is asked for: llama-cpp-python is an optional dependency
(``specframe[llamacpp]``).
"""
