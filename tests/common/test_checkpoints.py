"""Real checkpoint layouts written tiny: WeDLM / ReFusion Qwen3 causal DLMs, LLaDA, Dream and a Qwen2.5 guider.

Each foreign layout is written here from a native tiny model with the publishers' tensor names and config keys
(see services/common/checkpoints.py for the sources), then loaded back through load_model.
"""

import json
import math
import os
import re

import pytest
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from services.common import checkpoints
from services.common.config import EngineConfig
from services.common.models import load_meta, load_model, make_bidirectional
from services.common.proposal import Region
from services.common.request import Request
from services.dlm_drafter.bidirectional import BidirectionalCall, BidirectionalDrafter, new_cache
from services.orchestrator.engine.engine import Engine
from tests.tiny import tokenizer

SIZES = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
# transformers' AutoTokenizer reads Dream's config.json ("rope_scaling": null) on its own and warns about the key
pytestmark = pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")
PROMPT = "count from 1 to 9:"
IDS = torch.tensor([[5, 9, 11, 7, 3, 1, 1, 1, 40, 1, 60, 2]])  # 1 is the tiny tokenizer's mask


def special(tok) -> dict:
    return {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.eos_token_id}


def save_shards(state: dict[str, torch.Tensor], path: str, shards: int) -> None:
    """state as model.safetensors, or as `shards` files with model.safetensors.index.json."""
    os.makedirs(path, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}
    if shards == 1:
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    keys, weight_map = sorted(state), {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i::shards]}
        save_file(part, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def write_json(path: str, name: str, value: dict) -> None:
    with open(os.path.join(path, name), "w") as f:
        json.dump(value, f, indent=1)


# --- LLaDA: modeling_llada.py / configuration_llada.py layout ---------------------------------------------------

TO_LLADA = {
    "self_attn.q_proj": "q_proj",
    "self_attn.k_proj": "k_proj",
    "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "attn_out",
    "mlp.gate_proj": "ff_proj",
    "mlp.up_proj": "up_proj",
    "mlp.down_proj": "ff_out",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ff_norm",
}


def llada_raw(native: LlamaForCausalLM, tok, group: int) -> dict:
    c = native.config
    return {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"},
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_layer_norm": False,
        "block_group_size": group,
        "block_type": "llama",
        "d_model": c.hidden_size,
        "embedding_size": c.vocab_size,
        "vocab_size": len(tok),
        "include_bias": False,
        "include_qkv_bias": False,
        "input_emb_norm": False,
        "layer_norm_type": "rms",
        "mask_token_id": tok.mask_token_id,
        "max_sequence_length": c.max_position_embeddings,
        "mlp_hidden_size": c.intermediate_size,
        "mlp_ratio": 4,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "n_layers": c.num_hidden_layers,
        "rms_norm_eps": c.rms_norm_eps,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": c.rope_parameters["rope_theta"],
        "scale_logits": False,
        "use_cache": False,
        "weight_tying": c.tie_word_embeddings,
        **special(tok),
    }


def llada_state(native: LlamaForCausalLM, group: int) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in native.state_dict().items():
        if key == "model.embed_tokens.weight":
            out["model.transformer.wte.weight"] = value
        elif key == "model.norm.weight":
            out["model.transformer.ln_f.weight"] = value
        elif key == "lm_head.weight":
            if not native.config.tie_word_embeddings:
                out["model.transformer.ff_out.weight"] = value
        else:
            layer, name = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", key).groups()
            block = f"blocks.{layer}" if group == 1 else f"block_groups.{int(layer) // group}.{int(layer) % group}"
            out[f"model.transformer.{block}.{TO_LLADA[name]}.weight"] = value
    return out


def write_llada(path: str, tok, seed: int, tied: bool = False, group: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok) + 4, rope_theta=5e5, tie_word_embeddings=tied, **SIZES, **special(tok))
    native = LlamaForCausalLM(config).eval()
    save_shards(llada_state(native, group), path, shards=2)
    write_json(path, "config.json", llada_raw(native, tok, group))
    tok.save_pretrained(path)
    return native


def llada_reference(path: str, ids: torch.Tensor) -> torch.Tensor:
    """LLaDAModel.forward as modeling_llada.py computes it, on the foreign tensors (batch 1, no mask)."""
    raw, w = checkpoints.read_config(path), checkpoints.load_safetensors(path)
    d, heads, kv, eps = raw["d_model"], raw["n_heads"], raw["n_kv_heads"], raw["rms_norm_eps"]
    hd = d // heads

    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(t):  # [heads, T, hd]; rotate_half over the two halves
        inv = 1.0 / raw["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
        freqs = torch.outer(torch.arange(t.shape[1]).float(), inv)
        pos = torch.cat([freqs, freqs], -1)
        half = torch.cat([-t[..., hd // 2 :], t[..., : hd // 2]], -1)
        return t * pos.cos() + half * pos.sin()

    x = w["model.transformer.wte.weight"][ids[0]]
    T = x.shape[0]
    for i in range(raw["n_layers"]):
        b = {k.split(".")[-2]: v for k, v in w.items() if k.startswith(f"model.transformer.blocks.{i}.")}
        h = norm(x, b["attn_norm"])
        q = rope((h @ b["q_proj"].T).view(T, heads, hd).transpose(0, 1))
        k = rope((h @ b["k_proj"].T).view(T, kv, hd).transpose(0, 1)).repeat_interleave(heads // kv, 0)
        v = (h @ b["v_proj"].T).view(T, kv, hd).transpose(0, 1).repeat_interleave(heads // kv, 0)
        att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), -1) @ v  # no causal mask
        x = x + att.transpose(0, 1).reshape(T, d) @ b["attn_out"].T
        h = norm(x, b["ff_norm"])
        x = x + (torch.nn.functional.silu(h @ b["ff_proj"].T) * (h @ b["up_proj"].T)) @ b["ff_out"].T
    head = w["model.transformer.wte.weight"] if raw["weight_tying"] else w["model.transformer.ff_out.weight"]
    return norm(x, w["model.transformer.ln_f.weight"]) @ head.T


# --- Dream: modeling_dream.py layout (Qwen2 names), config.json of Dream-v0 ------------------------------------


def write_dream(path: str, tok, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), rope_theta=1e6, tie_word_embeddings=False, **SIZES, **special(tok))
    native = Qwen2ForCausalLM(config).eval()
    save_shards(native.state_dict(), path, shards=1)
    raw = {
        "architectures": ["DreamModel"],
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "model_type": "Dream",
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "mask_token_id": tok.mask_token_id,
        "max_window_layers": SIZES["num_hidden_layers"],
        "rms_norm_eps": config.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": 1e6,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": len(tok),
        **SIZES,
        **special(tok),
    }
    write_json(path, "config.json", raw)
    tok.save_pretrained(path)
    with open(os.path.join(path, "tokenizer_config.json")) as f:
        tok_config = json.load(f)
    tok_config["tokenizer_class"] = "DreamTokenizer"  # remote code in the real checkpoint: never run
    tok_config["auto_map"] = {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]}
    write_json(path, "tokenizer_config.json", tok_config)
    return native


# --- Qwen3 causal DLMs (WeDLM / ReFusion), Qwen2.5 guider --------------------------------------------------------


def qwen3(tok, seed: int, **extra) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tok), head_dim=8, tie_word_embeddings=False, **SIZES, **special(tok), **extra)
    return Qwen3ForCausalLM(config).eval()


def write_wedlm(path: str, tok, native):
    """WeDLMForCausalLM layout: the base model's tensors and keys, model_type wedlm, mask only in the tokenizer."""
    save_shards(native.state_dict(), path, shards=2)
    raw = {k: v for k, v in native.config.to_dict().items() if k not in ("rope_parameters", "dtype", "model_type")}
    raw.update(
        architectures=["WeDLMForCausalLM"],
        auto_map={"AutoConfig": "configuration_wedlm.WeDLMConfig", "AutoModelForCausalLM": "modeling_wedlm.WeDLM"},
        model_type="wedlm",
        qk_norm=isinstance(native, Qwen3ForCausalLM),
        rope_theta=native.config.rope_parameters["rope_theta"],
    )
    write_json(path, "config.json", raw)
    tok.save_pretrained(path)
    return native


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> dict:
    root = str(tmp_path_factory.mktemp("checkpoints"))
    tok = tokenizer(os.path.join(root, "tokenizer"))
    paths = {name: os.path.join(root, name) for name in ("qwen3", "wedlm", "llada", "llada_tied", "dream", "qwen2")}
    native = {
        "wedlm": write_wedlm(paths["wedlm"], tok, qwen3(tok, 11)),
        "llada": write_llada(paths["llada"], tok, 12),
        "llada_tied": write_llada(paths["llada_tied"], tok, 13, tied=True, group=2),
        "dream": write_dream(paths["dream"], tok, 14),
    }
    qwen3(tok, 15).save_pretrained(paths["qwen3"])  # ReFusion-style: plain Qwen3, mask token only in the tokenizer
    tok.save_pretrained(paths["qwen3"])
    torch.manual_seed(16)
    guider = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, **{**SIZES, "hidden_size": 16}, **special(tok))
    Qwen2ForCausalLM(guider).save_pretrained(paths["qwen2"])
    tok.save_pretrained(paths["qwen2"])
    return {"paths": paths, "native": native, "tok": tok}


def bidirectional_logits(model, ids: torch.Tensor) -> torch.Tensor:
    make_bidirectional(model)
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


def run_invariants(engine: Engine, strategy: str, params: dict, n: int = 16) -> list[int]:
    meta = engine.executor.meta()
    req = engine.request(PROMPT, max_new_tokens=n)
    events = list(engine.stream(req, strategy, params))
    ids = req.output_ids()
    assert meta.mask_id not in ids and meta.eos_id not in ids
    assert [t for e in events for t in e.ids][: len(ids)] == ids
    assert req.finish_reason == "eos" or len(ids) == n
    assert sorted(set(req.order)) == sorted(req.order)
    return ids


def test_families_are_detected(ckpt):
    expected = {
        "qwen3": "native",
        "wedlm": "wedlm",
        "llada": "llada",
        "llada_tied": "llada",
        "dream": "dream",
        "qwen2": "native",
    }
    for name, family in expected.items():
        assert checkpoints.detect_family(checkpoints.read_config(ckpt["paths"][name])) == family, name
    assert checkpoints.detect_family({"architectures": ["LLaDAModelLM"]}) == "llada"


# --- 1. Qwen3 causal DLMs --------------------------------------------------------------------------------------


def test_qwen3_dlm_with_tokenizer_mask_loads_and_streams(ckpt):
    path, tok = ckpt["paths"]["qwen3"], ckpt["tok"]
    raw = checkpoints.read_config(path)
    assert "mask_token_id" not in raw and "dlm_family" not in raw
    meta = load_meta(path)
    assert meta.mask_id == tok.mask_token_id == tok.convert_tokens_to_ids("<|mask|>")
    assert not meta.bidirectional and meta.logits_shift == 0
    engine = Engine(EngineConfig(models={"drafter": path}, max_new_tokens=16))
    run_invariants(engine, "streaming", {"window": 6})


def test_wedlm_layout_loads_as_qwen3(ckpt):
    path = ckpt["paths"]["wedlm"]
    loaded = load_model(path)
    assert type(loaded.model) is Qwen3ForCausalLM and not loaded.bidirectional
    assert loaded.mask_id == ckpt["tok"].mask_token_id and loaded.meta.logits_shift == 0
    with torch.no_grad():
        expected = ckpt["native"]["wedlm"](input_ids=IDS).logits
        torch.testing.assert_close(loaded.model(input_ids=IDS).logits, expected, atol=1e-5, rtol=0)
    run_invariants(Engine(EngineConfig(models={"drafter": path}, max_new_tokens=12)), "streaming", {"window": 4}, 12)


def test_wedlm_without_qk_norm_loads_as_qwen2(ckpt, tmp_path):
    tok = ckpt["tok"]
    torch.manual_seed(17)
    native = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), tie_word_embeddings=False, **SIZES, **special(tok)))
    write_wedlm(str(tmp_path), tok, native.eval())
    loaded = load_model(str(tmp_path))
    assert type(loaded.model) is Qwen2ForCausalLM and not loaded.bidirectional
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=IDS).logits, native(input_ids=IDS).logits, atol=1e-5, rtol=0)


# --- 2. LLaDA ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llada", "llada_tied"])
def test_llada_round_trip_equals_native_llama(ckpt, name):
    path, native = ckpt["paths"][name], ckpt["native"][name]
    loaded = load_model(path)
    assert type(loaded.model) is LlamaForCausalLM and loaded.bidirectional and loaded.meta.logits_shift == 0
    assert loaded.mask_id == checkpoints.read_config(path)["mask_token_id"]
    assert loaded.model.config.tie_word_embeddings == (name == "llada_tied")
    with torch.no_grad():
        got = loaded.model(input_ids=IDS).logits[0]
    torch.testing.assert_close(got, bidirectional_logits(native, IDS), atol=1e-5, rtol=0)


def test_llada_matches_its_own_forward_on_the_foreign_tensors(ckpt):
    """Independent of the mapping: LLaDA's math (ff_proj gated by SiLU, up_proj linear) on the written tensors."""
    loaded = load_model(ckpt["paths"]["llada"])
    with torch.no_grad():
        got = loaded.model(input_ids=IDS).logits[0]
    torch.testing.assert_close(got, llada_reference(ckpt["paths"]["llada"], IDS), atol=1e-5, rtol=0)


def test_llada_unsupported_options_are_refused():
    base = {"d_model": 32, "n_heads": 4, "n_layers": 2, "block_type": "llama", "activation_type": "silu"}
    base.update(layer_norm_type="rms", rope=True)
    checkpoints.llada_config(base)
    for key, value in [("block_type", "sequential"), ("scale_logits", True), ("include_bias", True), ("rope", False)]:
        with pytest.raises(ValueError, match=key):
            checkpoints.llada_config({**base, key: value})
    assert checkpoints.llada_config(base).mask_token_id == checkpoints.LLADA_MASK_ID  # no mask id in the config


@pytest.mark.parametrize("strategy", ["mdm", "threshold"])
def test_engine_decodes_llada(ckpt, strategy):
    engine = Engine(EngineConfig(models={"drafter_bidirectional": ckpt["paths"]["llada"]}, max_new_tokens=16))
    run_invariants(engine, strategy, {"block_size": 8})


# --- 3. Dream ----------------------------------------------------------------------------------------------------


def test_dream_round_trip_equals_native_qwen2(ckpt):
    path = ckpt["paths"]["dream"]
    loaded = load_model(path)
    assert type(loaded.model) is Qwen2ForCausalLM and loaded.bidirectional
    assert loaded.meta.logits_shift == 1 and loaded.mask_id == ckpt["tok"].mask_token_id
    assert type(loaded.tokenizer).__name__ == "Qwen2Tokenizer"  # not the remote DreamTokenizer
    with torch.no_grad():
        got = loaded.model(input_ids=IDS).logits[0]
    torch.testing.assert_close(got, bidirectional_logits(ckpt["native"]["dream"], IDS), atol=1e-5, rtol=0)


def propose(drafter: BidirectionalDrafter, req: Request, region: Region, state, cache: str):
    return drafter.propose_batch([BidirectionalCall(req, region, state, cache, None)])[0][0]


def dream_request(loaded) -> Request:
    req = Request("r", [5, 9, 11, 7], 16, loaded.mask_id, loaded.eos_id)
    req.decide(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 13]), torch.tensor([30, 31, 32, 33, 34, 35, 36, 37, 50]))
    return req


def test_dream_shift_is_honoured(ckpt):
    """A block's prediction for position i is the full forward's output at i - 1, not at i."""
    loaded = load_model(ckpt["paths"]["dream"])
    req, region = dream_request(loaded), Region(8, 16)
    proposal = propose(BidirectionalDrafter(loaded), req, region, new_cache(), "none")
    seq = torch.tensor(req.prompt_ids + req.tokens.tolist())[None]
    with torch.no_grad():
        full = loaded.model(input_ids=seq).logits[0].float()  # a proposal keeps them as the model gave them
    P, masked = req.prompt_len, proposal.positions
    assert masked.tolist() == [8, 9, 10, 11, 12, 14, 15]
    torch.testing.assert_close(proposal.logits, full[P + masked - 1], atol=1e-5, rtol=0)
    assert not torch.allclose(proposal.logits, full[P + masked], atol=1e-3)


@pytest.mark.parametrize("cache", ["prefix", "dual", "freecache"])
def test_dream_cached_block_forward_matches_full_forward(ckpt, cache):
    """The window reaches one position before the block: cached forwards still equal the uncached one."""
    loaded = load_model(ckpt["paths"]["dream"])
    drafter, state = BidirectionalDrafter(loaded), new_cache()
    reference = propose(drafter, dream_request(loaded), Region(8, 16), new_cache(), "none").logits
    req = dream_request(loaded)
    first = propose(drafter, req, Region(8, 16), state, cache)
    again = propose(drafter, req, Region(8, 16), state, cache)
    torch.testing.assert_close(first.logits, reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(again.logits, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("strategy", ["mdm", "threshold"])
def test_engine_decodes_dream(ckpt, strategy):
    engine = Engine(EngineConfig(models={"drafter_bidirectional": ckpt["paths"]["dream"]}, max_new_tokens=16))
    run_invariants(engine, strategy, {"block_size": 8})


# --- 4. Qwen2.5 guider -------------------------------------------------------------------------------------------


def test_qwen2_guider_is_lossless_under_guided_top1(ckpt):
    paths = ckpt["paths"]
    models = {"drafter": paths["qwen3"], "guider": paths["qwen2"], "ar": paths["qwen2"]}
    engine = Engine(EngineConfig(models=models, max_new_tokens=16))
    assert type(engine.executor.load("guider").model) is Qwen2ForCausalLM
    reference = engine.generate(PROMPT, "ar", {"model": "guider"}, max_new_tokens=16)
    params = {"top_k_match": 1, "drafter": "causal", "block_size": 8, "follow": "guider"}
    guided = engine.generate(PROMPT, "guided", params, 16)
    assert guided.token_ids == reference.token_ids and guided.finish_reason == reference.finish_reason
    assert engine.generate(PROMPT, "ar", {"model": "ar"}, max_new_tokens=16).token_ids == reference.token_ids
