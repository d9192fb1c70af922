"""Targets: transformers models of every family, llama.cpp, the real default model, the converted-model cache and the
machine layer (cores, load, profile, packed weights, cost curve)."""
