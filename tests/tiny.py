"""Tiny random-initialised models of each family, written to disk in the layout the engine loads."""

import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from services.filter.model import FilterConfig, Learn2PDFilter

TEXT = [
    "count from 1 to 9: 1 2 3 4 5 6 7 8 9",
    "copy: the quick brown fox jumps over the lazy dog",
    "def add(a, b): return a + b",
    "sort 5 3 9 1: 1 3 5 9",
]
SPECIAL = ["<|endoftext|>", "<|mask|>", "<|response|>"]


def tokenizer(path: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", mask_token="<|mask|>"
    )
    fast.chat_template = "{{ messages[-1]['content'] }}<|response|>"
    fast.save_pretrained(path)
    return fast


def qwen3_kwargs(vocab_size: int, hidden: int = 64, **kw) -> dict:
    base = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return {**base, **kw}


def causal_lm(path: str, tok: PreTrainedTokenizerFast, seed: int, family: str | None, hidden: int = 64) -> str:
    torch.manual_seed(seed)
    config = Qwen3Config(**qwen3_kwargs(len(tok), hidden, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    if family:
        config.mask_token_id = tok.mask_token_id
        config.dlm_family = family
        config.is_causal = family == "causal"
    Qwen3ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def zoo(root: str) -> dict[str, str]:
    """Write a causal drafter, a bidirectional drafter, a guider, an AR baseline and a filter per drafter family
    under root."""
    tok = tokenizer(os.path.join(root, "tokenizer"))
    paths = {
        "drafter": causal_lm(os.path.join(root, "drafter"), tok, 1, "causal"),
        "drafter_bidirectional": causal_lm(os.path.join(root, "drafter_bidirectional"), tok, 2, "bidirectional"),
        "guider": causal_lm(os.path.join(root, "guider"), tok, 3, None, hidden=32),
        "ar": causal_lm(os.path.join(root, "ar"), tok, 4, None),
    }
    torch.manual_seed(5)
    for role in ("filter", "filter_bidirectional"):
        Learn2PDFilter(FilterConfig()).save(os.path.join(root, role))
        paths[role] = os.path.join(root, role)
    return paths
