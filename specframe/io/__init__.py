"""Files specframe reads and writes: prompts in Spec-Bench's format, JSON Lines, YAML, output folders written whole."""
