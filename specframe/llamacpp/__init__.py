"""The llama.cpp engine: a GGUF on llama.cpp's CPU kernels as the target (docs/llamacpp.md).

- :mod:`~specframe.llamacpp.binding`: llama-cpp-python's low-level API (import, build features, context, batch);
- :mod:`~specframe.llamacpp.target`: the target and its scorer (the engine's KV invariant on a llama.cpp context);
- :mod:`~specframe.llamacpp.profile`: T(n) per thread count on this machine, for the router;
- :mod:`~specframe.llamacpp.loader`: GGUF + tokenizer + build check + threads -> a target;
- :mod:`~specframe.llamacpp.peers`: llama.cpp's own decoding and prompt lookup as bench peers.

Nothing here is imported unless ``engine: llama.cpp`` is asked for: llama-cpp-python is an optional dependency
(``specframe[llamacpp]``).
"""
