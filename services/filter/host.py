"""The Learn2PD filter behind a batched method: every request's block confidences scored in one MLP call."""

import torch

from services.common.calls import Reply
from services.filter.model import Learn2PDFilter


class FilterHost:
    def __init__(self, model: Learn2PDFilter):
        self.model = model

    def accept_probs(self, calls: list[tuple[torch.Tensor]]) -> list[Reply]:
        """(block confidences [n],) -> accept scores [n]."""
        return [Reply(scores) for scores in self.model.accept_probs_batch([conf for (conf,) in calls])]

    def block_size(self) -> int:
        return self.model.config.block_size
