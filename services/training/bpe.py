"""Byte-level BPE tokenizer (tokenizers library) saved as a transformers PreTrainedTokenizerFast dir.

Digits are split one per token (a space may attach to the first digit), so arithmetic sees digit columns.
Special tokens take ids 0, 1, 2 in SPECIALS order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from services.training import dataset
from services.training.specials import EOS, MASK, RESPONSE, SPECIALS

# GPT-2 style split, but `\p{N}` one digit at a time
PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}" + RESPONSE + "{% endif %}"
)


@dataclass(slots=True)
class BpeConfig:
    vocab_size: int = 4096
    min_frequency: int = 2
    out: str = "models/tokenizer"
    data: str = "data"
    task_samples: int = 2000  # per family, formatted as training sequences

    def __post_init__(self) -> None:
        if not 259 <= self.vocab_size <= 8192:
            raise ValueError(f"vocab_size must be in [259, 8192], got {self.vocab_size}")
        if self.task_samples < 0:
            raise ValueError("task_samples must be >= 0")


def build(texts: Iterable[str], cfg: BpeConfig) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def train_from_data(cfg: BpeConfig) -> PreTrainedTokenizerFast:
    """Corpus train split + the first task_samples train items of each family; saved to cfg.out."""
    texts = dataset.load_corpus(cfg.data, "train")
    per: dict[str, int] = {}
    for t in dataset.load_tasks(cfg.data, "train"):
        if per.setdefault(t.family, 0) < cfg.task_samples:
            per[t.family] += 1
            texts += [t.prompt, t.response]  # specials kept out of the merge statistics
    fast = build(texts, cfg)
    save(fast, cfg.out)
    return fast


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        additional_special_tokens=[RESPONSE],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save(fast: PreTrainedTokenizerFast, out: str | Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return out


def special_ids(fast: PreTrainedTokenizerFast) -> dict[str, int]:
    return {s: fast.convert_tokens_to_ids(s) for s in SPECIALS}
