"""Learn2PD filter (004 §3.2): a 2-layer MLP from a block's confidences to per-position accept logits. Each drafter
family has its own (services/filter/host.py): a filter learns the confidences of the drafter that trained it."""

import json
import os
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG = "filter_config.json"
WEIGHTS = "model.safetensors"


def pad_blocks(confidences: list[torch.Tensor], block_size: int) -> torch.Tensor:
    """Each block's confidences [n <= block] -> [B, block]. Positions past n read 1.0, as decided positions do: the
    one padding convention of training (EGP rows) and inference, so a short window scores as the filter learned."""
    padded = torch.ones(len(confidences), block_size)
    for row, conf in enumerate(confidences):
        padded[row, : len(conf)] = conf[:block_size].float()
    return padded


@dataclass(slots=True)
class FilterConfig:
    block_size: int = 32  # 004 §4.1 block length
    hidden_size: int = 32  # 004 §4: 2,112 parameters at block 32, i.e. (32 * 32 + 32) + (32 * 32 + 32)
    threshold: float = 0.96  # 004 §4.3, on sigmoid(logit)

    def __post_init__(self):
        if self.block_size < 1 or self.hidden_size < 1:
            raise ValueError("filter block_size and hidden_size must be >= 1")
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"filter threshold must be in [0, 1], got {self.threshold}")


class Learn2PDFilter(nn.Module):
    def __init__(self, config: FilterConfig):
        super().__init__()
        self.config = config
        self.mlp = nn.Sequential(
            nn.Linear(config.block_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, config.block_size),
        )

    def forward(self, confidence: torch.Tensor) -> torch.Tensor:
        """confidence [B, block] -> accept logits [B, block]."""
        return self.mlp(confidence)

    @torch.inference_mode()
    def accept_probs_batch(self, confidences: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each confidence [n <= block] of one block -> sigmoid scores [n] (short blocks padded by pad_blocks)."""
        scores = torch.sigmoid(self(pad_blocks(confidences, self.config.block_size)))
        return [scores[row, : len(conf)] for row, conf in enumerate(confidences)]

    def accept_probs(self, confidence: torch.Tensor, request_id: str = "") -> torch.Tensor:
        """One block's scores; request_id lets a remote filter batch concurrent requests."""
        return self.accept_probs_batch([confidence])[0]

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        save_file(self.state_dict(), os.path.join(path, WEIGHTS))
        with open(os.path.join(path, CONFIG), "w") as f:
            json.dump(asdict(self.config), f, indent=2)

    @classmethod
    def load(cls, path: str) -> "Learn2PDFilter":
        config_path = os.path.join(path, CONFIG)
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"filter directory has no {CONFIG}: {path}")
        with open(config_path) as f:
            model = cls(FilterConfig(**json.load(f)))
        model.load_state_dict(load_file(os.path.join(path, WEIGHTS)))
        return model.eval()
