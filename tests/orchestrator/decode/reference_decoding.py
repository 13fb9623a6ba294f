"""Plain re-implementations of the published blockwise decoding loops, written from the papers and apart from the
engine, for test_reference_decoding.py. Greedy; the model is called directly on prompt + canvas.

- LLaDA low-confidence remasking (004 §3.1.1, Eq. 3-4): per block, `steps` forwards; each unmasks the
  most confident masked tokens of the block, as many as LLaDA's schedule gives that step (the block's masks spread
  evenly over the steps, the remainder to the first ones).
- Fast-dLLM threshold decoding (001 §2.2): per forward, the most confident masked token of the block and every other
  one whose confidence is at least the threshold.
- Fast-dLLM caches: `prefix` runs a full forward at each block's start (which decodes that step), keeps the KV before
  the block and recomputes block + suffix over it; `dual` keeps the prefix and the suffix KV of that full forward and
  recomputes the block alone.

The mask token is never an output (as in the engine: a model may not choose [MASK]); confidence is the chosen
token's probability. Every block of the canvas is decoded, whatever EOS it holds, and every position stays in context;
the output is the canvas up to its first EOS.
"""

from collections.abc import Callable

import torch
from transformers import DynamicCache, PreTrainedModel

Select = Callable[[torch.Tensor, int], torch.Tensor]  # (confidences of the block's masks [M], step) -> chosen [M] bool


def llada_schedule(masked: int, steps: int) -> list[int]:
    """LLaDA's get_num_transfer_tokens: tokens unmasked at each of a block's steps."""
    base, rest = divmod(masked, steps)
    return [base + (i < rest) for i in range(steps)]


def low_confidence(block_size: int, steps: int) -> Select:
    schedule = llada_schedule(block_size, steps)

    def select(conf: torch.Tensor, step: int) -> torch.Tensor:
        chosen = torch.zeros(len(conf), dtype=torch.bool)
        chosen[conf.topk(min(schedule[step], len(conf))).indices] = True
        return chosen

    return select


def threshold(value: float) -> Select:
    def select(conf: torch.Tensor, step: int) -> torch.Tensor:
        chosen = conf >= value
        chosen[conf.argmax()] = True
        return chosen

    return select


class Forward:
    """Logits [block, V] for the current block under one of Fast-dLLM's cache modes (none, prefix, dual)."""

    def __init__(self, model: PreTrainedModel, prompt: list[int], cache: str, mask_id: int):
        self.model, self.prompt, self.cache, self.mask_id = model, torch.tensor(prompt), cache, mask_id
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer (keys, values) kept from the full forward

    def __call__(self, canvas: torch.Tensor, lo: int, hi: int, first: bool) -> torch.Tensor:
        P = len(self.prompt)
        x = torch.cat([self.prompt, canvas])
        if self.cache == "none" or first:  # the block's first step decodes from the full forward
            out = self.model(input_ids=x[None], use_cache=self.cache != "none")
            if self.cache != "none":
                self.kv = [
                    (self.kept(layer.keys, P + lo, P + hi), self.kept(layer.values, P + lo, P + hi))
                    for layer in out.past_key_values.layers
                ]
            logits = out.logits[0, P + lo : P + hi]
        else:
            # dual: Fast-dLLM replaces the block's KV in place; here the block follows the suffix, the same under
            # full attention (RoPE is in the cached keys)
            end = len(x) if self.cache == "prefix" else P + hi
            kv = DynamicCache()
            for i, (k, v) in enumerate(self.kv):
                kv.update(k, v, i)
            out = self.model(
                input_ids=x[None, P + lo : end],
                position_ids=torch.arange(P + lo, end)[None],
                attention_mask=torch.ones(1, kv.get_seq_length() + end - P - lo, dtype=torch.long),
                past_key_values=kv,
            )
            logits = out.logits[0, : hi - lo]
        return logits.float().index_fill(-1, torch.tensor([self.mask_id]), float("-inf"))

    def kept(self, t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """[..., S, D] of the full forward -> the prefix before lo (prefix), or prefix and suffix past hi (dual)."""
        if self.cache == "prefix":
            return t[..., :lo, :]
        return torch.cat([t[..., :lo, :], t[..., hi:, :]], -2)


@torch.inference_mode()
def decode(
    model: PreTrainedModel, prompt: list[int], length: int, block_size: int, select: Select, mask_id: int, cache: str
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The full canvas [length] and, per forward, the canvas after it (for checking where EOS was decided)."""
    assert length % block_size == 0, "LLaDA and Fast-dLLM decode whole blocks"
    canvas = torch.full((length,), mask_id)
    forward = Forward(model, prompt, cache, mask_id)
    trajectory = []
    for lo in range(0, length, block_size):
        hi, step = lo + block_size, 0
        while (canvas[lo:hi] == mask_id).any():
            probs = torch.softmax(forward(canvas, lo, hi, step == 0), -1)
            conf, pred = probs.max(-1)
            masked = (canvas[lo:hi] == mask_id).nonzero().squeeze(-1)
            chosen = masked[select(conf[masked], step)]
            canvas[lo + chosen] = pred[chosen]
            trajectory.append(canvas.clone())
            step += 1
    return canvas, trajectory


def eos_ahead(trajectory: list[torch.Tensor], eos_id: int, mask_id: int) -> bool:
    """Whether some forward leaves the first EOS decided before the canvas's last position with positions before it
    still masked: from then on, a decoder that cut the canvas just past that EOS would see another context."""
    for canvas in trajectory:
        eos_at = (canvas[:-1] == eos_id).nonzero()
        if len(eos_at):
            return bool((canvas[: int(eos_at[0])] == mask_id).any())
    return False


def output(canvas: torch.Tensor, eos_id: int) -> list[int]:
    """The canvas up to its first EOS."""
    ids = canvas.tolist()
    return ids[: ids.index(eos_id)] if eos_id in ids else ids
