"""Tiny random models of every decoder type in the installed transformers, for sweeps.

``causal_lm_types()`` lists the model types of transformers' causal-LM mapping; ``tiny_config(t)`` shrinks the
type's default config by generic, name-based rules (no per-type table); ``build_tiny(t)`` builds the mapping's class
from it (float32, CPU, eval); ``family(t, config)`` sorts it into dense / moe / sliding window / hybrid / recurrent;
``reference_greedy`` is transformers' own greedy ``generate``; ``buildable(t)`` says in one line why transformers
itself cannot build or generate with a type (encoder-only types, types needing pixel or audio inputs, ...).

Shrinking rules: hidden 64, 4 heads (2 KV heads) of dim 16, intermediate 128 (MoE: 4 experts, 2 per token, expert
intermediate 32), vocabulary ``vocab_size`` (default 64; other vocabularies at most that), positions 512, windows /
chunks / sparse top-k 8, SSM state 8. Layers: the fewest layers of the default config that include one layer of each
kind (attention / sliding / linear / conv / dense / sparse ...), at least 2, with every per-layer list, index list,
period/offset pair and pattern string of the config cut to those layers, so that the config stays consistent.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any

import torch

VOCAB = 64
HIDDEN = 64
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
INTERMEDIATE, EXPERT_INTERMEDIATE = 128, 32
EXPERTS, EXPERTS_PER_TOKEN = 4, 2
POSITIONS = 512
WINDOW = 8
MAX_PARAMETERS = 20_000_000

# Integer config fields, by name (full match on the field's own name, first rule wins): name -> new value given the
# old one (None: leave unchanged). Applied to the decoder config and, for composite configs, to every sub-config.
_small = lambda target: (lambda v: target if v > target else None)  # noqa: E731
_RULES: list[tuple[str, Any]] = [
    (r"(.*_)?(type_vocab_size|vocab_size_divisible_by|vocab_size_base|num_codebooks|vocab_offset)", lambda v: None),
    (r"vocab_size", "vocab"),  # the vocabulary: exactly tiny_config's vocab_size (resolved per call, see _rule)
    (r".*vocab.*", "at most vocab"),  # other vocabularies (per-layer inputs, ...): shrunk to it
    (r"(first_k_dense_replace|num_dense_layers|num_dense_blocks|moe_layer_start_index|num_nextn_predict_layers)",
     lambda v: min(v, 1) if v > 1 else None),
    (r"num_kv_shared_layers", lambda v: 0),
    (r"(.*_)?(n_routed_experts|num_local_experts|num_experts|moe_num_experts|num_experts_per_layer)",
     lambda v: EXPERTS if v >= 1 else None),
    (r"(.*_)?(num_experts_per_tok|num_experts_per_token|moe_topk|moe_top_k|moe_k|top_k|experts_per_token)",
     _small(EXPERTS_PER_TOKEN)),
    (r"(n_group|num_expert_group|topk_group|n_groups|mamba_n_groups|mamba_ngroups|o_groups)", _small(1)),
    (r"(.*_)?(n_shared_experts|num_shared_experts|zero_expert_num)", _small(1)),
    (r"(.*_)?(index_topk|index_topk_blocks|index_pool_size|index_block_size|index_num_local_tokens)", _small(WINDOW)),
    (r".*(sliding_window|window_size|window_len|chunk_size|local_attention|chunk_length)", _small(WINDOW)),
    (r"(max_position_embeddings|n_positions|n_ctx|max_seq_len|max_sequence_length|context_length|"
     r"max_target_positions|model_max_length|num_position_embeddings)", lambda v: POSITIONS),
    (r"qk_rope_head_dim|rotary_dim", _small(HEAD_DIM // 2)),
    (r"qk_head_dim", lambda v: HEAD_DIM + HEAD_DIM // 2),
    (r"q_lora_rank|o_lora_rank", _small(2 * HEAD_DIM)),
    (r".*_rank", _small(HEAD_DIM)),
    (r".*(head_dim|d_head|dim_head|head_size|headdim|kv_channels)", _small(HEAD_DIM)),
    (r".*(key_value_heads|kv_heads|kv_n_heads|query_groups|num_key_heads)", _small(KV_HEADS)),
    (r".*heads?", _small(HEADS)),
    (r".*(moe|expert|shared).*(intermediate|ffn|hidden_size).*", _small(EXPERT_INTERMEDIATE)),
    (r".*(intermediate|ffn|d_ff|dff|dim_ff|n_inner|mlp_dim|feed_forward_size|d_inner|mamba_d_ssm).*",
     _small(INTERMEDIATE)),
    (r"(.*_)?(state_size|d_state|dt_rank|time_step_rank)", _small(8)),
    (r"(mamba_)?expand", _small(1)),
    (r".*per_layer_input", _small(16)),
    (r"(.*_)?(hidden_size|hidden_dim|d_model|n_embd|n_embed|embed_dim|emb_dim|embedding_dim|embedding_size|lru_width|"
     r"model_dim|proj_dim|output_dim|input_dim|out_dim|in_dim|width)", _small(HIDDEN)),
    (r"(.*_)?(num_hidden_layers|n_layers?|num_layers|decoder_layers|encoder_layers|num_decoder_layers|"
     r"num_encoder_layers|depth)", _small(2)),
]


def _rule(f: Any, vocab: int) -> Any:
    """A rule of ``_RULES`` with the call's vocabulary size filled in (rules are built once, at import; the vocabulary
    is an argument of :func:`tiny_config`)."""
    if f == "vocab":
        return lambda v: vocab
    if f == "at most vocab":
        return _small(vocab)
    return f


# The only per-type entries: default configs with no layer kinds although the model needs them.
_DEFAULT_KINDS = {"lfm2_moe": {"layer_types": ["conv", "full_attention"]}}
_LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
_ID_NAME = re.compile(r".*(_token_id|_token_index|_token_ids|_index|_id)")
_NO_ID = ("bos_token_id", "eos_token_id", "forced_eos_token_id", "decoder_start_token_id")
_INDEX_LIST = re.compile(r".*(_idxs|_indices|_indexes|_ids|_layers)")  # lists of layer indices
_KIND_WORDS = re.compile(r"attention|attn|mamba|linear|conv|recurrent|hybrid|sliding|full|local|global|moe|mlp|"
                         r"sparse|dense|chunk|rwkv|ssm|lsh")


def causal_lm_types() -> list[str]:
    """Sorted model types of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (the installed version's)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _model_class(model_type: str) -> type:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def _kind_lists(d: dict[str, Any], n: int) -> dict[str, tuple[str, list]]:
    """The config's per-layer descriptions: ``{field: (form, one value per layer for each of its n layers)}``.

    Forms: "list" (per-layer list of length ``n``), "cycle" (a shorter list of kinds repeated, recurrent_gemma's
    ``block_types``), "index" (a list of layer indices, ``*_indices``, ``*_layers``, ...: membership), "period"
    (``X_period`` / ``X_offset``: membership), "pattern" (a string, ``hybrid_override_pattern``), "runs"
    (``[[kinds, repeat], ...]``, gpt_neo's ``attention_types``).
    """
    out: dict[str, tuple[str, list]] = {}
    for name, v in d.items():
        ints = isinstance(v, list) and bool(v) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
        if ints and _INDEX_LIST.fullmatch(name) and v == sorted(set(v)) and max(v) < n:
            out[name] = "index", [i in v for i in range(n)]
        elif isinstance(v, list) and len(v) == n:
            out[name] = "list", list(v)
        elif isinstance(v, list) and 1 < len(v) < n and all(isinstance(x, str) and _KIND_WORDS.search(x) for x in v):
            out[name] = "cycle", [v[i % len(v)] for i in range(n)]
        elif isinstance(v, str) and len(v) == n > 1 and name.endswith("pattern"):
            out[name] = "pattern", list(v)
        elif isinstance(v, list) and v and all(isinstance(x, list) and len(x) == 2 and isinstance(x[1], int)
                                                for x in v):
            out[name] = "runs", [k for kinds, rep in v for _ in range(rep) for k in kinds]
        elif name.endswith("_period") and isinstance(v, int) and v > 0 and isinstance(d.get(name[:-6] + "offset"), int):
            out[name] = "period", [i % v == d[name[:-6] + "offset"] for i in range(n)]
    return out


def _pick_layers(kinds: dict[str, tuple[str, list]], n: int) -> list[int]:
    """The fewest layer indices covering every kind value (strings and memberships), at least 2, earliest first."""
    def signature(i: int) -> set:
        return {(k, v[i]) for k, (_, v) in kinds.items() if isinstance(v[i], (str, bool))}

    needed = set().union(*(signature(i) for i in range(n)))
    firsts: dict[frozenset, int] = {}
    for i in range(n):
        firsts.setdefault(frozenset(signature(i)), i)
    candidates = sorted(firsts.values())
    picked = list(range(min(n, 2)))
    for size in range(1, len(candidates) + 1):
        combo = next((c for c in itertools.combinations(candidates, size)
                      if set().union(*(signature(i) for i in c)) >= needed), None)
        if combo is not None:
            picked = list(combo) + [i for i in range(n) if i not in combo][:max(0, 2 - size)]
            break
    return sorted(picked)


def _cut_layers(d: dict[str, Any], kinds: dict[str, tuple[str, list]], picked: list[int]) -> dict[str, Any]:
    """Overrides that rewrite the config's per-layer descriptions for the ``picked`` layers."""
    out: dict[str, Any] = {}
    m = len(picked)
    for name, (form, per_layer) in kinds.items():
        new = [per_layer[i] for i in picked]
        if form == "pattern":
            out[name] = "".join(new)
        elif form == "period":
            hits = [j for j, hit in enumerate(new) if hit]
            out[name], out[name[:-6] + "offset"] = (m, hits[0]) if hits else (m + 1, m)
        elif form == "runs":
            out[name] = [[[k], 1] for k in new]
        elif form == "index":
            out[name] = [j for j, hit in enumerate(new) if hit]
        else:
            out[name] = new
    return out


def _hybrid_default(config: Any, n: int) -> Any:
    """The default config made hybrid where its class can be but its defaults are not.

    An attention-layer index list left empty or covering every layer (bamba's ``attn_layer_indices``, lfm2's
    ``full_attn_idxs``) is set to the last layer; a layer-kind list of recurrent layers only on a config with
    attention heads (granitemoehybrid) gets a full-attention last layer.
    """
    d = config.to_dict()
    if config.model_type in _DEFAULT_KINDS:
        kinds = _DEFAULT_KINDS[config.model_type]
        return type(config)(**kinds, **{_layer_count(d)[0]: len(next(iter(kinds.values())))})
    for name, v in d.items():
        if re.fullmatch(r"(full_)?(attn|attention)_(layer_)?(idxs|indices|ids)", name) and (
                not v or sorted(v) == list(range(n))):
            return type(config)(**{name: [n - 1]})
    for name, v in d.items():
        if (name.endswith(("layer_types", "block_type")) and isinstance(v, list) and len(v) == n
                and {"linear_attention"} == set(v) and "num_attention_heads" in d):
            return type(config)(**{name: v[:-1] + ["full_attention"]})
    return config


def _layer_count(d: dict[str, Any]) -> tuple[str | None, int | None]:
    """The name of the layer-count field (None if derived from a list) and the layer count."""
    name = next((k for k in _LAYER_COUNT_NAMES if isinstance(d.get(k), int)), None)
    if name:
        return name, d[name]
    lists = [len(v) for k, v in d.items() if isinstance(v, list) and k.endswith(("layer_types", "block_type"))]
    return None, max(lists, default=None)


def _shrink(config: Any, vocab: int) -> dict[str, Any]:
    """Override kwargs for one (sub-)config: name rules, special ids (inside ``[0, vocab)``), layers."""
    d = config.to_dict()
    fields = {f.name: str(f.type) for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else {}

    def nullable(name: str) -> bool:
        return "None" in fields.get(name, "None")

    over: dict[str, Any] = {}
    for name, v in d.items():
        if name == "is_decoder":  # encoder types under their causal-LM class run as decoders
            over[name] = True
        if v is None and re.fullmatch(r".*(head_dim|key_value_heads|num_experts_per_tok|n_routed_experts|n_shared_experts)", name) \
                and "int" in fields.get(name, ""):  # left to derive, but the model reads it (hunyuan, nemotron)
            v = 10**9
        if isinstance(v, bool):
            continue
        if name in _NO_ID or name == "pad_token_id" or (name.endswith("token_id") and isinstance(v, list)):
            inside = isinstance(v, int) and 0 <= v < vocab
            over[name] = v if name == "pad_token_id" and inside else None if nullable(name) else v if inside else 0
            continue
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            rule = next((_rule(f, vocab) for pat, f in _RULES if re.fullmatch(pat, name)), None)
            if rule is not None and name.endswith(("size", "sizes")):  # per-layer sizes (gemma3n's intermediate)
                over[name] = [rule(x) or x for x in v]
            continue
        if not isinstance(v, int):
            continue
        if _ID_NAME.fullmatch(name) and "layer" not in name and name not in ("lang_id", "unk_index", "mask_index"):
            if not 0 <= v < vocab:
                over[name] = vocab - 1 - sum(1 for k in over if _ID_NAME.fullmatch(k))
            continue
        for pat, f in _RULES:
            if re.fullmatch(pat, name):
                new = _rule(f, vocab)(v)
                if new is not None and new != v:
                    over[name] = new
                break
    if "kv_lora_rank" in d and "num_key_value_heads" in d:  # MLA: one KV head per query head
        over["num_key_value_heads"] = over.get("num_attention_heads", d.get("num_attention_heads"))
    if "qk_rope_head_dim" in over and d.get("head_dim") == d["qk_rope_head_dim"]:  # MLA rotary head (longcat)
        over["head_dim"] = over["qk_rope_head_dim"]
    n_name, n = _layer_count(d)
    if n:
        kinds = _kind_lists(d, n)
        picked = _pick_layers(kinds, n)
        over.update(_cut_layers(d, kinds, picked))
        if n_name:
            over[n_name] = len(picked)
        if "moe_layer_end_index" in d:
            over["moe_layer_end_index"] = len(picked) - 1
    return over


def _rebuild(config: Any, vocab: int) -> Any:
    """A new config of the same class, shrunk; sub-configs shrunk recursively.

    A field the config derives from others in ``__post_init__`` (zamba2's ``attention_hidden_size``, mamba's
    ``intermediate_size``) is not overridden: it is left out when leaving it out already changes it.
    """
    cls = type(config)
    config = _hybrid_default(config, _layer_count(config.to_dict())[1] or 0)
    over = _shrink(config, vocab)
    try:
        default = cls().to_dict()
    except Exception:  # noqa: BLE001 - no default: keep every override
        default = {}
    for name, value in list(over.items()):
        if isinstance(value, int) and not isinstance(value, bool) and name in default:
            rest = {k: v for k, v in over.items() if k != name}
            try:
                derived = getattr(cls(**rest), name)
            except Exception:  # noqa: BLE001 - the field is needed
                continue
            if derived != default[name]:
                over = rest
    for name, sub in vars(config).items():
        if name.endswith("config") and hasattr(sub, "to_dict") and hasattr(sub, "model_type"):
            over[name] = _rebuild(sub, vocab)
    return cls(**over, dtype="float32")


def tiny_config(model_type: str, vocab_size: int = VOCAB) -> Any:
    """A tiny config of ``model_type``: the type's default config shrunk by the module's generic rules.

    For composite configs, the config the mapping's causal-LM class takes (its ``config_class``: the text/decoder
    sub-config, or the composite one with every sub-config shrunk).

    Args:
        model_type: a key of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``.
        vocab_size: V (special and extra token ids are set inside ``[0, V)`` or to None).

    Raises:
        KeyError: unknown model type; whatever the config class raises on the shrunk values.
    """
    from transformers import CONFIG_MAPPING

    wanted = getattr(_model_class(model_type), "config_class", None)
    default = CONFIG_MAPPING[model_type]()
    if wanted is not None and not isinstance(default, wanted):
        subs = [s for s in vars(default).values() if isinstance(s, wanted)]
        default = subs[0] if subs else wanted()
    return _rebuild(default, vocab_size)


def _sharpen(model: Any, vocab: int = VOCAB) -> None:
    """Scale the output embedding so that logits on a fixed prompt have a standard deviation of about 2."""
    out = model.get_output_embeddings()
    weight = getattr(out, "weight", None)
    if weight is None:
        return
    ids = torch.tensor([_prompt(12, vocab)], device=model.device)
    with torch.no_grad():
        std = float(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float().std(-1).mean())
        if 0 < std < 1.0:
            weight.mul_(min(2.0 / std, 1000.0))


def build_tiny(model_type: str, seed: int = 0, vocab_size: int = VOCAB) -> Any:
    """The tiny random model of ``model_type``: the mapping's class built from ``tiny_config(model_type, vocab_size)``.

    Weights from ``torch.manual_seed(seed)`` (the global RNG is restored); float32, CPU, eval mode; the output
    embedding is scaled when the logits are nearly flat; ``generation_config`` has no EOS/BOS and pad 0.

    Raises:
        ValueError: the tiny config still has more than ``MAX_PARAMETERS`` parameters.
        whatever transformers raises building the model or running one forward.
    """
    config = tiny_config(model_type, vocab_size)
    with torch.device("meta"):  # a config the rules did not shrink must not take the machine's memory
        size = sum(p.numel() for p in _model_class(model_type)(config).parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"tiny config of {model_type} still has {size:,} parameters (> {MAX_PARAMETERS:,})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(model_type)(config).float().eval()
    gc = model.generation_config
    gc.eos_token_id = gc.bos_token_id = None
    gc.pad_token_id = 0
    _sharpen(model, vocab_size)
    return model


def _layer_kinds(config: Any) -> list[str]:
    """Per-layer kinds: transformers' cache layer types, plus every kind-like string list of the config."""
    kinds: list[str] = []
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds += list(get_layer_types_and_kwargs(config)[0])
    except Exception:  # noqa: BLE001 - helper missing or config without per-layer configs
        pass
    for name, v in config.to_dict().items():
        if name.startswith("mtp_"):
            continue
        if isinstance(v, list) and v and isinstance(v[0], list) and len(v[0]) == 2:  # run-length
            v = [k for kinds_, _ in v for k in kinds_]
        if isinstance(v, str) and name.endswith("pattern"):
            v = list(v)
        if isinstance(v, list) and any(isinstance(x, str) and _KIND_WORDS.search(x) for x in v):
            kinds += [x for x in v if isinstance(x, str)]
    return kinds


def family(model_type: str, config: Any) -> str:
    """One of "hybrid", "recurrent", "sliding window", "moe", "dense" (first that applies), from the config.

    Recurrent layers are linear-attention / mamba / conv / recurrent kinds (or a config with no attention heads at
    all, or a recurrent model type: rwkv, xlstm); hybrid = recurrent and attention layers mixed; sliding window = sliding / chunked / local
    layers or a window size on a model with attention; moe = more than one expert.
    """
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    kinds = {k.lower() for k in _layer_kinds(config)}
    d = config.to_dict()
    recurrent = {k for k in kinds if re.search(r"linear|mamba|conv|recurrent|rwkv|ssm|^m$", k)}
    attention = {k for k in kinds if re.search(r"attention|attn|global|local|full|sliding|chunk|^\*$", k)} - recurrent
    has_heads = any(re.fullmatch(r"(.*attention_heads|n_heads?|num_heads)", k) for k in d)
    if {"hybrid", "hybrid_sliding"} & kinds or (recurrent and attention):
        return "hybrid"
    if recurrent or not has_heads or re.search(r"mamba|rwkv|lstm|rnn", config.model_type):
        return "recurrent"
    if any(re.search(r"sliding|chunk|local", k) for k in kinds):
        return "sliding window"
    experts = max((v for k, v in d.items() if isinstance(v, int) and not isinstance(v, bool)
                   and re.fullmatch(r"(.*_)?(n_routed_experts|num_local_experts|num_experts|moe_num_experts)", k)),
                  default=0)
    if experts > 1 or {"sparse", "moe"} & kinds:
        return "moe"
    return "dense"


@torch.inference_mode()
def reference_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy ``generate`` (attention mask of ones, pad 0): the ``max_new_tokens`` new ids."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _prompt(length: int, vocab: int = VOCAB) -> list[int]:
    """A fixed prompt of ids in [1, vocab - 1] ([1, 63] at the default vocabulary)."""
    return [1 + (7 * i * i + 13 * i + 5) % (vocab - 1) for i in range(length)]


def buildable(model_type: str) -> tuple[Any | None, str]:
    """Build the tiny model and generate 8 tokens after a 12-token prompt with transformers itself.

    Returns:
        ``(model, "")``, or ``(None, reason)`` with ``reason`` = the exception's type and first line when transformers
        cannot build or generate with the type.
    """
    try:
        model = build_tiny(model_type)
        new = reference_greedy(model, _prompt(12), 8)
        if len(new) != 8:
            return None, f"generate returned {len(new)} new tokens, not 8"
        return model, ""
    except Exception as e:  # noqa: BLE001 - the reason is the point
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"{type(e).__name__}: {first}"[:300]
