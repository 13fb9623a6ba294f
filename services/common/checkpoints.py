"""Checkpoints in their publishers' layouts, mapped onto native transformers classes; no remote code ever runs.

Families, detected from config.json (`model_type`, else `architectures`):
  native  any config transformers knows (Qwen3 causal DLMs, Qwen2.5 guiders, ...): loaded as before
  wedlm   Tencent WeDLM (`WeDLMForCausalLM`): Qwen3 architecture and tensor names -> Qwen3ForCausalLM
          (Qwen2ForCausalLM when its config has qk_norm false)
  llada   GSAI-ML LLaDA (`LLaDAModelLM`, OLMo-based): renamed onto LlamaForCausalLM, run bidirectionally
  dream   Dream-org Dream (`DreamModel`): Qwen2 tensor names -> Qwen2ForCausalLM, bidirectional; its output at
          position i-1 predicts token i (logits_shift 1)

Sources read (remote code of the checkpoints, as copied into public repositories):
  LLaDA  modeling_llada.py (copy in YoungNoOne/dLLMs): LLaDALlamaBlock has q_proj, k_proj, v_proj, attn_out,
         attn_norm, ff_norm, ff_proj, up_proj, ff_out; its MLP is `x, x_up = ff_proj(x), up_proj(x);
         x = act(x) * x_up; ff_out(x)`, so ff_proj is the gate (SiLU) and up_proj the up projection. LLaDAModel holds
         transformer.{wte, ln_f, blocks | block_groups, ff_out (absent when weight_tying)} under LLaDAModelLM.model;
         logits are ln_f -> ff_out (or wte when weight_tying), times 1/sqrt(d_model) only with scale_logits.
         RMSLayerNorm normalises in fp32 with eps=rms_norm_eps, then weight * x; RoPE is rotate-half over
         head_dim = d_model // n_heads with base rope_theta; attention has no mask (bidirectional).
         configuration_llada.py (copy in charleschen-ml/pa-dllm): ModelConfig keys and defaults (d_model, n_heads,
         n_kv_heads, n_layers, mlp_ratio, mlp_hidden_size, activation_type, block_type, block_group_size, rope,
         rope_theta, rms_norm_eps, max_sequence_length, include_bias, include_qkv_bias, vocab_size, embedding_size,
         weight_tying=True, mask_token_id); model_type "llada".
         The same names and gate orientation in TransformerLensOrg/TransformerLens
         transformer_lens/model_bridge/supported_architectures/llada.py (gate=ff_proj, in=up_proj, out=ff_out).
  Dream  dream/model/modeling_dream.py (NVlabs/Fast-dLLM, "modified from HKUNLP/Dream"): DreamModel = DreamBaseModel
         `model` (embed_tokens, layers.N.{self_attn.{q,k,v}_proj with bias, o_proj without, mlp.{gate,up,down}_proj,
         input_layernorm, post_attention_layernorm}, norm) + lm_head: Qwen2's names; attention is_causal=False.
         The generation code (dream/model/generation_utils_block.py there, and copies of the checkpoint's
         generation_utils.py) shifts logits right by one: `logits = torch.cat([logits[:,:1], logits[:, :-1]], dim=1)`.
  WeDLM  Tencent/WeDLM finetune/src/model.py, loss.py, trainer.py: the masked-token loss compares the output at each
         mask with the token at that same position, the AR loss is the usual next-token one; so a mask's output
         predicts its own position (no shift), as our causal drafter assumes. arkavo-ai/WeDLM-rs src/config.rs: a
         Qwen3 config (qk_norm, head_dim, optional mask_token_id).
"""

import json
import os
import re

import torch
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
    Qwen3Config,
    Qwen3ForCausalLM,
)

MODEL_TYPES = {"wedlm": "wedlm", "llada": "llada", "dream": "dream"}
ARCHITECTURES = {"WeDLMForCausalLM": "wedlm", "LLaDAModelLM": "llada", "DreamModel": "dream"}
LLADA_MASK_ID = 126336  # GSAI-ML/LLaDA generate.py default mask_id, <|mdm_mask|> of the LLaDA tokenizer
REMOTE_KEYS = ("model_type", "architectures", "auto_map")


def read_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


def detect_family(raw: dict) -> str:
    family = MODEL_TYPES.get(str(raw.get("model_type", "")).lower())
    if family is None:
        family = next((ARCHITECTURES[a] for a in raw.get("architectures") or () if a in ARCHITECTURES), "native")
    return family


def native_kwargs(raw: dict) -> dict:
    kwargs = {k: v for k, v in raw.items() if k not in REMOTE_KEYS}
    if kwargs.get("rope_scaling", 0) is None:  # the legacy key, null in Dream's config.json
        del kwargs["rope_scaling"]
    return kwargs


def wedlm_config(raw: dict) -> Qwen3Config | Qwen2Config:
    """WeDLM-8B is Qwen3 (qk_norm); a WeDLM without qk_norm (WeDLM-7B, from Qwen2.5) is tried as Qwen2, whose
    tensor names the strict load in load_causal_lm then checks."""
    kwargs = native_kwargs(raw)
    return Qwen3Config(**kwargs) if kwargs.pop("qk_norm", True) else Qwen2Config(**kwargs)


def dream_config(raw: dict) -> Qwen2Config:
    config = Qwen2Config(**native_kwargs(raw))
    config.dlm_family, config.is_causal, config.logits_shift = "bidirectional", False, 1
    return config


# LLaDA ModelConfig defaults (configuration_llada.py) for the keys the mapping reads.
LLADA_DEFAULTS = {
    "d_model": 768,
    "n_heads": 12,
    "n_layers": 12,
    "n_kv_heads": None,
    "multi_query_attention": None,
    "mlp_ratio": 4,
    "mlp_hidden_size": None,
    "activation_type": "swiglu",
    "block_type": "sequential",
    "block_group_size": 1,
    "alibi": False,
    "rope": False,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "max_sequence_length": 1024,
    "attention_layer_norm": False,
    "layer_norm_type": "default",
    "layer_norm_with_affine": True,
    "include_bias": False,
    "include_qkv_bias": False,
    "bias_for_layer_norm": None,
    "input_emb_norm": False,
    "scale_logits": False,
    "vocab_size": 50257,
    "embedding_size": 50304,
    "weight_tying": True,
}
# What LlamaForCausalLM computes; anything else in a LLaDA config is refused rather than silently approximated.
LLADA_REQUIRED = {
    "block_type": "llama",
    "activation_type": "silu",
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "rope": True,
    "alibi": False,
    "attention_layer_norm": False,
    "include_bias": False,
    "include_qkv_bias": False,
    "input_emb_norm": False,
    "scale_logits": False,
}


def llada_settings(raw: dict) -> dict:
    cfg = {**LLADA_DEFAULTS, **raw}
    for key, want in LLADA_REQUIRED.items():
        if cfg[key] != want and not (key == "include_qkv_bias" and cfg[key] is None):
            raise ValueError(f"LLaDA config {key}={cfg[key]!r} is not supported (needs {want!r})")
    if cfg["bias_for_layer_norm"]:
        raise ValueError("LLaDA config bias_for_layer_norm=True is not supported")
    if cfg["d_model"] % cfg["n_heads"]:
        raise ValueError("LLaDA d_model must be a multiple of n_heads")
    return cfg


def llada_kv_heads(cfg: dict) -> int:
    if cfg["n_kv_heads"] is not None:
        return cfg["n_kv_heads"]
    return 1 if cfg["multi_query_attention"] else cfg["n_heads"]


def llada_config(raw: dict) -> LlamaConfig:
    cfg = llada_settings(raw)
    d = cfg["d_model"]
    config = LlamaConfig(
        vocab_size=cfg["embedding_size"] or cfg["vocab_size"],  # wte / ff_out rows
        hidden_size=d,
        intermediate_size=cfg["mlp_hidden_size"] or cfg["mlp_ratio"] * d,  # SiLU: output_multiplier 1
        num_hidden_layers=cfg["n_layers"],
        num_attention_heads=cfg["n_heads"],
        num_key_value_heads=llada_kv_heads(cfg),
        head_dim=d // cfg["n_heads"],
        hidden_act="silu",
        max_position_embeddings=cfg["max_sequence_length"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=cfg["rope_theta"],
        tie_word_embeddings=bool(cfg["weight_tying"]),
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=cfg.get("eos_token_id"),
        pad_token_id=cfg.get("pad_token_id"),
    )
    config.mask_token_id = LLADA_MASK_ID if cfg.get("mask_token_id") is None else cfg["mask_token_id"]
    config.dlm_family, config.is_causal = "bidirectional", False
    return config


LLADA_BLOCK = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "attn_out": "self_attn.o_proj",
    "ff_proj": "mlp.gate_proj",  # act(ff_proj(x)) * up_proj(x)
    "up_proj": "mlp.up_proj",
    "ff_out": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ff_norm": "post_attention_layernorm",
}
LLADA_TOP = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
}
LLADA_BLOCK_KEY = re.compile(r"model\.transformer\.(?:blocks\.(\d+)|block_groups\.(\d+)\.(\d+))\.(\w+)\.weight")


def llada_state_dict(state: dict[str, torch.Tensor], raw: dict) -> dict[str, torch.Tensor]:
    group = {**LLADA_DEFAULTS, **raw}["block_group_size"]
    out = {}
    for key, tensor in state.items():
        if key in LLADA_TOP:
            out[LLADA_TOP[key]] = tensor
            continue
        match = LLADA_BLOCK_KEY.fullmatch(key)
        if match is None or match[4] not in LLADA_BLOCK:
            raise ValueError(f"unexpected LLaDA tensor {key}")
        layer = int(match[1]) if match[1] is not None else int(match[2]) * group + int(match[3])
        out[f"model.layers.{layer}.{LLADA_BLOCK[match[4]]}.weight"] = tensor
    return out


def load_config(path: str) -> tuple[str, PretrainedConfig]:
    """(family, a native transformers config) for the checkpoint directory."""
    raw = read_config(path)
    family = detect_family(raw)
    if family == "native":
        return family, AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    return family, {"wedlm": wedlm_config, "llada": llada_config, "dream": dream_config}[family](raw)


def load_tokenizer(path: str, family: str):
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError):
        if family == "native":
            raise
    # the checkpoint names a remote tokenizer class (Dream's DreamTokenizer is Qwen2's); use the native one
    cls = Qwen2Tokenizer if family in ("dream", "wedlm") else PreTrainedTokenizerFast
    return cls.from_pretrained(path, local_files_only=True)


def logits_shift(config: PretrainedConfig) -> int:
    """How far right a position's prediction sits from its output: 1 when output i-1 predicts token i (Dream)."""
    return int(getattr(config, "logits_shift", 0) or 0)


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards model.safetensors.index.json names."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(path, "model.safetensors")):
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path} has neither model.safetensors nor model.safetensors.index.json")
    state = {}
    for shard in shards:
        state.update(load_file(os.path.join(path, shard)))
    return state


def native_state_dict(path: str, family: str) -> dict[str, torch.Tensor]:
    state = {k: v for k, v in load_safetensors(path).items() if not k.endswith("rotary_emb.inv_freq")}
    if family == "llada":
        return llada_state_dict(state, read_config(path))
    return state  # WeDLM and Dream use their base architecture's tensor names


CLASSES = {Qwen3Config: Qwen3ForCausalLM, LlamaConfig: LlamaForCausalLM, Qwen2Config: Qwen2ForCausalLM}


def load_causal_lm(path: str, dtype: torch.dtype, attn_implementation: str) -> PreTrainedModel:
    family, config = load_config(path)
    kwargs = {"dtype": dtype, "attn_implementation": attn_implementation}
    if family == "native":
        return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=False, **kwargs)
    cls = CLASSES[type(config)]
    state = native_state_dict(path, family)
    model, info = cls.from_pretrained(None, config=config, state_dict=state, output_loading_info=True, **kwargs)
    missing = set(info["missing_keys"]) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        raise ValueError(
            f"{family} checkpoint {path} does not match {cls.__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(info['unexpected_keys'])}, mismatched {sorted(info['mismatched_keys'])}"
        )
    return model
