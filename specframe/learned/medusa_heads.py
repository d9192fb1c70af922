"""Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", §2.1.1): head ``i`` maps the target's last hidden state ``h_t`` (post final norm, the LM head's input) to
a distribution over the token ``i + 2`` positions ahead, through ``L`` residual blocks and the target's own LM
head::

    p_t^(i) = softmax(W_lm · (h_t + Σ ResBlock_i(h_t)))      ResBlock(x) = x + SiLU(W x + b)

``W`` starts at zero, so an untrained head predicts what the LM head predicts (the Medusa initialisation).

Saved as ``medusa.safetensors`` (head weights only, the LM head stays the target's) plus ``medusa.json``
``{"format": 1, "hidden_size", "num_heads", "num_layers", "target"}``. Heads trained over a frequent-token subset
of the vocabulary (FR-Spec, Zhao et al. 2025) also store that subset as ``specframe.token_map`` (int64 ``[S]``,
ascending target ids) and ``"vocab_subset": S`` in the json; the proposer then scores only those ``S`` rows of
the LM head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import ConfigError

FORMAT = 1
TOKEN_MAP = "specframe.token_map"


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: Tensor) -> Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads of ``num_layers`` residual blocks each (the LM head is applied by the caller).

    ``forward(h [.., H]) -> [.., num_heads, H]``: the features each head feeds to the target's LM head.
    """

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1, token_map: Tensor | None = None) -> None:
        super().__init__()
        self.hidden_size, self.num_heads, self.num_layers = hidden_size, num_heads, num_layers
        self.token_map = None if token_map is None else token_map.to(torch.int64).cpu()  # [S] or None: full vocab
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)]) for _ in range(num_heads)
        )

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.stack([head(hidden) for head in self.heads], dim=-2)

    def save(self, directory: Path, target: str) -> None:
        import safetensors.torch

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        if self.token_map is not None:
            state[TOKEN_MAP] = self.token_map.contiguous()
        safetensors.torch.save_file(state, str(directory / "medusa.safetensors"), metadata={"format": "pt"})
        meta = {"format": FORMAT, "hidden_size": self.hidden_size, "num_heads": self.num_heads,
                "num_layers": self.num_layers, "target": target}
        if self.token_map is not None:
            meta["vocab_subset"] = int(self.token_map.numel())
        (directory / "medusa.json").write_text(json.dumps(meta, indent=1) + "\n")

    @staticmethod
    def load(directory: Path, hidden_size: int) -> "MedusaHeads":
        """Load heads saved by :meth:`save`.

        Raises:
            ConfigError: missing files, another format, or heads made for another hidden size.
        """
        import safetensors.torch

        meta_path, weights = directory / "medusa.json", directory / "medusa.safetensors"
        if not meta_path.is_file() or not weights.is_file():
            raise ConfigError(f"{directory} holds no Medusa heads (needs medusa.json and medusa.safetensors)")
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT:
            raise ConfigError(f"{meta_path}: format {meta.get('format')!r}, this specframe reads format {FORMAT}")
        if meta["hidden_size"] != hidden_size:
            raise ConfigError(
                f"Medusa heads in {directory} were trained for hidden size {meta['hidden_size']}, "
                f"the target's is {hidden_size}: train heads for this target (`specframe train medusa`)"
            )
        state = safetensors.torch.load_file(str(weights))
        heads = MedusaHeads(hidden_size, meta["num_heads"], meta["num_layers"], state.pop(TOKEN_MAP, None))
        heads.load_state_dict(state)
        return heads.eval()
