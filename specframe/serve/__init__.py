"""``specframe serve``: the OpenAI API over the batched engine (docs/serving.md)."""
