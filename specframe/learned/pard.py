"""PARD parallel draft models (An et al. 2025, "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model
Adaptation", arXiv 2504.18583): the layout AMD publishes them in, and what reads it.

A PARD draft is an ordinary transformers causal LM sharing the target's vocabulary, fine-tuned so that ``k - 1``
copies of one **mask token** appended after the context make the positions they occupy predict the tokens 2..k
ahead: one forward over ``[context..., newest, mask x (k - 1)]`` (consecutive positions, the model's own causal
attention) drafts ``k`` tokens. It reads nothing of the target, so one draft serves a family of targets.

Layout (AMD's checkpoints amd/PARD-Llama-3.2-1B, amd/PARD-DeepSeek-R1-Distill-Qwen-1.5B, amd/PARD-Qwen2.5-0.5B,
amd/PARD-Qwen3-0.6B; the fields are the ones AMD's training script sets on the model's config before saving): the
usual ``config.json`` / weights / tokenizer files, with two more fields in ``config.json``:

- ``pard_token``: the mask token id. A token the vocabulary reserves and never uses: 128020 in Llama 3's
  (``<|reserved_special_token_12|>``), 151665 in Qwen2.5's (the first embedding row past the tokenizer's 151665
  tokens, a padding row of the 151936);
- ``spd_type``: ``"pard"``.

vLLM reads the same field (``pard_token``) when a draft model runs with ``parallel_drafting: true``.

Here: :func:`pard_mask_token` reads the field (``draft-model`` switches to parallel drafting on it);
:func:`write_pard` / :func:`convert_to_pard` write a model or a draft folder in the layout, choosing the mask as
PARD's recipe does (a spare embedding row, else a new one); :func:`pard_batch` and :func:`drop_rows` build PARD's
training layout (every block position of a sequence trained in one forward, and the conditional drop of mask rows)
for a training recipe to fine-tune the converted draft with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError

PARD_MASK_FIELD = "pard_token"
PARD_TYPE_FIELD = "spd_type"
PARD_TYPE = "pard"


def pard_mask_token(config: Any) -> int | None:
    """The mask token a draft's config declares (``pard_token``), or None when it declares none.

    Args:
        config: a transformers config or a ``config.json`` dict.

    Raises:
        ConfigError: the field holds something other than a non-negative integer.
    """
    value = config.get(PARD_MASK_FIELD) if isinstance(config, dict) else getattr(config, PARD_MASK_FIELD, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config.json field {PARD_MASK_FIELD} must be a token id (a non-negative integer), "
                          f"not {value!r}")
    return int(value)


# --- writing the layout ---------------------------------------------------------------------------------------------


def choose_mask_token(embed_rows: int, tokens: int) -> int | None:
    """Where PARD's recipe puts the mask token when none is given: the first embedding row past the tokenizer's
    ``tokens`` (a padding row, as Qwen2.5's 151665), or None when the embedding has no spare row (one is added)."""
    return tokens if embed_rows > tokens else None


def write_pard(model: Any, out: Path, mask_token_id: int | None = None, tokenizer: Any = None,
               sources: tuple[Path, ...] = ()) -> int:
    """Write ``model`` (a transformers causal LM) into ``out`` as a PARD draft: its weights, its ``config.json`` with
    ``pard_token`` and ``spd_type``, and ``tokenizer``'s files when given.

    With no ``mask_token_id``, the mask is the first embedding row past the tokenizer's tokens (``len(tokenizer)``,
    else the config's ``vocab_size``) when there is one, else a row added to the embeddings (``model`` is resized in
    place; transformers initialises the new row to the mean of the others). The folder is written whole or not at
    all (:func:`specframe.io.atomic.replace_folder`).

    Returns:
        the mask token id.

    Raises:
        ConfigError: ``mask_token_id`` outside the model's embedding; ``out`` is a source or a folder specframe did
            not write.
    """
    from ..io.atomic import replace_folder

    rows = int(model.get_input_embeddings().weight.shape[0])
    if mask_token_id is None:
        tokens = len(tokenizer) if tokenizer is not None else int(model.config.vocab_size)
        mask_token_id = choose_mask_token(rows, tokens)
        if mask_token_id is None:
            model.resize_token_embeddings(rows + 1)
            mask_token_id = rows
    elif not 0 <= mask_token_id < rows:
        raise ConfigError(f"mask_token_id {mask_token_id} is outside the model's {rows} embedding rows: choose a "
                          "token the model embeds (a reserved or unused one), or leave it out to add a row")
    setattr(model.config, PARD_MASK_FIELD, int(mask_token_id))
    setattr(model.config, PARD_TYPE_FIELD, PARD_TYPE)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    replace_folder(Path(out), fill, sources)
    return int(mask_token_id)


def convert_to_pard(src: Path, out: Path, mask_token_id: int | None = None) -> int:
    """Copy the draft in ``src`` into ``out`` in PARD's layout, ready for PARD's fine-tuning (:func:`pard_batch`)
    and for ``draft-model``'s parallel mode once fine-tuned.

    ``src`` is a transformers causal LM folder (:func:`write_pard` chooses the mask token as PARD's recipe does) or a
    specframe small draft (``specframe train draft``), which embeds with the target's own embedding, so it can take
    no new row: ``mask_token_id`` must name a target token the draft may take over (a reserved or unused one).

    Returns:
        the mask token id.

    Raises:
        ConfigError: no config.json; a small draft without ``mask_token_id`` or with one outside the target's
            vocabulary; as :func:`write_pard`.
    """
    import shutil

    from ..io.atomic import replace_folder
    from .small_draft import META, is_small_draft

    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise ConfigError(f"{src} has no config.json: give a transformers model folder or a specframe small draft")
    if is_small_draft(src):
        vocab = int(json.loads((src / META).read_text())["target_vocab_size"])
        if mask_token_id is None or not 0 <= mask_token_id < vocab:
            got = "no mask_token_id" if mask_token_id is None else f"mask_token_id {mask_token_id}"
            raise ConfigError(f"{src} is a specframe small draft, which embeds with the target's {vocab}-token "
                              f"embedding, and {got} is given: name a target token in [0, {vocab}) the draft may "
                              "take over as its mask (a reserved or unused one)")
        config = json.loads((src / "config.json").read_text())
        config[PARD_MASK_FIELD], config[PARD_TYPE_FIELD] = int(mask_token_id), PARD_TYPE

        def fill(tmp: Path) -> None:
            for f in src.iterdir():
                if f.is_file() and f.name != "config.json":
                    shutil.copy2(f, tmp / f.name)
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

        replace_folder(out, fill, (src,))
        return int(mask_token_id)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    tok_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    tokenizer = AutoTokenizer.from_pretrained(src) if any((src / f).is_file() for f in tok_files) else None
    return write_pard(model, out, mask_token_id, tokenizer, sources=(src,))


# --- PARD's training layout -----------------------------------------------------------------------------------------


def pard_batch(input_ids: Tensor, k: int, mask_token_id: int, labels: Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """One forward's inputs that train every block position at once (PARD's recipe, section 3 of the paper).

    The sequence (``L`` tokens) is laid out ``k`` times: group 0 is the tokens, group ``i >= 1`` is ``L`` mask tokens.
    Row ``(i, t)`` sits at position ``t`` and sees the real tokens ``0..t - i`` and the masks ``(j, t - i + j)``,
    ``j = 1..i`` — exactly what the row of mask ``i`` sees at inference after the context ``0..t - i`` — and is trained
    to predict token ``t + 1``, ``i + 1`` places after the last real token it sees. Group 0 is ordinary
    next-token prediction.

    Args:
        input_ids: ``[B, L]`` int64.
        k: the block: positions trained per real token (``k - 1`` mask groups).
        mask_token_id: the mask token.
        labels: ``[B, L]`` int64 with -100 where no loss is taken (a prompt, padding); default: ``input_ids``.
        dtype: the attention mask's (the model's dtype).

    Returns:
        ``input_ids`` / ``position_ids`` / ``labels`` ``[B, k L]`` (``labels`` aligned with the rows, not shifted:
        row ``r``'s target is ``labels[:, r]``, -100 where none) and ``attention_mask`` ``[B, 1, k L, k L]``
        additive (0 where a row sees a column, the dtype's minimum elsewhere), which transformers uses as given.
    """
    b, n = input_ids.shape
    if k < 1:
        raise ValueError(f"k must be >= 1, not {k}")
    labels = input_ids if labels is None else labels
    device = input_ids.device
    group = torch.arange(k, device=device).repeat_interleave(n)  # [k L]: each row's group i
    pos = torch.arange(n, device=device).repeat(k)  # [k L]: each row's position t
    last = pos - group  # the last real token a row sees
    # row (i, t) sees (0, s) for s <= t - i, and (j, u) for 1 <= j <= i with u - j == t - i
    real = (group[None, :] == 0) & (pos[None, :] <= last[:, None])
    masks = (group[None, :] >= 1) & (group[None, :] <= group[:, None]) & ((pos - group)[None, :] == last[:, None])
    seen = real | masks
    attention = torch.zeros(k * n, k * n, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)
    ids = torch.cat([input_ids] + [torch.full_like(input_ids, mask_token_id)] * (k - 1), dim=1)
    nxt = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)  # [B, L]: token t + 1
    target = nxt[:, pos].clone()
    target[:, last < 0] = -100  # a row that sees no real token predicts nothing
    return {"input_ids": ids, "position_ids": pos[None, :].expand(b, -1).contiguous(),
            "attention_mask": attention[None, None].expand(b, 1, -1, -1), "labels": target}


def drop_rows(batch: dict[str, Tensor], k: int, ratio: float, min_ratio: float,
              generator: torch.Generator) -> dict[str, Tensor]:
    """PARD's conditional drop (COD): keep every group-0 row and, of group ``i``, a random ``max(ratio ** i,
    min_ratio)`` share of the rows whose group ``i - 1`` row one position back was kept (each kept row's masks are
    kept with it, so it sees what it sees at inference). The same rows for the whole batch.

    Args:
        batch: :func:`pard_batch`'s output for block ``k`` (more ``[B, k L]`` entries, one value per row, are
            kept with their rows).
        ratio, min_ratio: in (0, 1].
        generator: the randomness.
    """
    n = batch["input_ids"].shape[1] // k
    keep = [torch.arange(n)]
    prev = torch.arange(n)
    for i in range(1, k):
        count = int(n * max(ratio ** i, min_ratio))
        candidates = prev + 1
        candidates = candidates[candidates < n]
        if count == 0 or candidates.numel() == 0:
            break
        chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:count]].sort().values
        keep.append(chosen + i * n)
        prev = chosen
    rows = torch.cat(keep).to(batch["input_ids"].device)
    mask = batch["attention_mask"][:, :, rows][:, :, :, rows]
    # every other entry is one value per row ([B, k L]: input_ids, position_ids, labels, and any a caller adds)
    return {**{key: v[:, rows] for key, v in batch.items() if key != "attention_mask"}, "attention_mask": mask}
