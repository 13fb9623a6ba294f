"""The Learn2PD filters of one replica behind batched methods, one per drafter family as the drafters' host has one
method per drafter: every request's block confidences scored in one MLP call."""

import torch

from services.common.calls import Reply
from services.filter.model import Learn2PDFilter

ROLES = {"causal": "filter", "bidirectional": "filter_bidirectional"}  # drafter family -> its filter's config role
METHODS = {"causal": "accept_probs", "bidirectional": "accept_probs_bidirectional"}  # drafter family -> host method


def configured_filters(models: dict[str, str]) -> tuple[Learn2PDFilter | None, Learn2PDFilter | None]:
    """(causal, bidirectional) filters of a config's models (role -> directory), None where a role is not set."""
    causal, bidirectional = (models.get(ROLES[family]) for family in ("causal", "bidirectional"))
    return tuple(Learn2PDFilter.load(path) if path else None for path in (causal, bidirectional))


class FilterHost:
    def __init__(self, causal: Learn2PDFilter | None, bidirectional: Learn2PDFilter | None):
        self.filters = {family: f for family, f in (("causal", causal), ("bidirectional", bidirectional)) if f}

    def family(self, drafter: str) -> Learn2PDFilter:
        if drafter not in self.filters:
            raise ValueError(f"no filter for the {drafter} drafter configured (models.{ROLES[drafter]})")
        return self.filters[drafter]

    def accept_probs(self, calls: list[tuple[torch.Tensor]]) -> list[Reply]:
        """(block confidences [n],) of the causal drafter -> accept scores [n]."""
        return self.scores("causal", calls)

    def accept_probs_bidirectional(self, calls: list[tuple[torch.Tensor]]) -> list[Reply]:
        """(block confidences [n],) of the bidirectional drafter -> accept scores [n]."""
        return self.scores("bidirectional", calls)

    def scores(self, drafter: str, calls: list[tuple[torch.Tensor]]) -> list[Reply]:
        return [Reply(s) for s in self.family(drafter).accept_probs_batch([conf for (conf,) in calls])]

    def block_sizes(self) -> dict[str, int]:
        """Drafter family -> the block its filter reads."""
        return {drafter: f.config.block_size for drafter, f in self.filters.items()}
