"""The Learn2PD filters of one replica behind the contract's FilterHost methods (services/common/contract.py), one
per drafter family: each family's requests are scored in one MLP call."""

import torch

from services.common.contract import FAMILIES, FILTER_MODELS, AcceptProbs, Reply
from services.filter.model import Learn2PDFilter


def configured_filters(models: dict[str, str]) -> dict[str, Learn2PDFilter]:
    """Drafter family -> its filter, for the families a config's models (key -> directory) name a filter for."""
    return {f: Learn2PDFilter.load(models[FILTER_MODELS[f]]) for f in FAMILIES if FILTER_MODELS[f] in models}


class FilterHost:
    def __init__(self, filters: dict[str, Learn2PDFilter]):
        self.filters = filters

    def family(self, drafter: str) -> Learn2PDFilter:
        if drafter not in self.filters:
            raise ValueError(f"no filter for the {drafter} drafter configured (models.{FILTER_MODELS[drafter]})")
        return self.filters[drafter]

    def accept_probs(self, calls: list[AcceptProbs]) -> list[Reply]:
        replies: list[Reply | None] = [None] * len(calls)
        for family in dict.fromkeys(c.family for c in calls):
            at = [i for i, c in enumerate(calls) if c.family == family]
            scores = self.family(family).accept_probs_batch([calls[i].confidence for i in at])
            for i, s in zip(at, scores, strict=True):
                replies[i] = Reply(s)
        return replies

    def block_sizes(self) -> dict[str, int]:
        return {drafter: f.config.block_size for drafter, f in self.filters.items()}

    def check_health(self) -> None:
        for f in self.filters.values():
            f(torch.zeros(1, f.config.block_size))
