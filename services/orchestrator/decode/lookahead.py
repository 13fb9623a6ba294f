"""The guider decoding its own tokens while the drafter drafts (pipeline, follow=guider, lookahead=k).

With follow=guider the output is the guider's greedy decode, so while the drafter drafts a window the guider can go
on decoding alone from the frontier: its k tokens go out in the same batched step as the drafter's proposal, and
stand in the proposal in place of the drafter's drafts at the first k positions. The verify forward then checks them
with the drafts after them: they agree by construction (the guider's own argmax after the same prefix), so a round
decides at least those k tokens, and the drafts only have to extend them. Where drafter and guider compute at once
(separate devices) and k guider forwards take as long as the drafter's, a round is then never slower than the guider
alone; in one process the guider's forwards add to the drafter's (README, Strategies). The output is the guider's
greedy decode either way: every decided token is what the verify forward's argmax says.
"""

from dataclasses import dataclass

import torch

from services.common.contract import Call, Lookahead, Role, Stage
from services.common.proposal import Proposal, Region
from services.common.request import Request
from services.orchestrator.decode.overlap import together
from services.orchestrator.decode.propose import CausalPropose


@dataclass(frozen=True, slots=True)
class GuiderLookahead:
    """The propose stage: the drafter's proposal with the guider's next k tokens in front."""

    propose: CausalPropose
    k: int

    def __call__(self, req: Request, region: Region) -> Stage[Proposal]:
        start = req.frontier  # a live round's region starts there and holds at least one position
        k = min(self.k, region.end - start)
        proposal, ahead = yield from together(self.propose(req, region), guider_tokens(req, start, k))
        return with_tokens(proposal, torch.arange(start, start + len(ahead)), ahead)


def guider_tokens(req: Request, start: int, k: int) -> Stage[torch.Tensor]:
    (ids,) = yield [Call(Role.GUIDER, Lookahead(req, start, k))]
    return ids


def with_tokens(proposal: Proposal, positions: torch.Tensor, ids: torch.Tensor) -> Proposal:
    """The proposal with ids [A] at positions [A] in place of its drafts there (or beside them, where a position
    held a tentative draft rather than a mask), each certain: probability 1, entropy 0. The drafter's logits and
    logprobs no longer line up with it and are dropped: follow=guider reads the guider's."""
    own = ~torch.isin(proposal.positions, positions)
    order = torch.cat([proposal.positions[own], positions]).argsort()

    def merged(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
        return torch.cat([mine[own], theirs])[order]

    return Proposal(
        merged(proposal.positions, positions),
        merged(proposal.ids, ids),
        merged(proposal.probs, torch.ones(len(ids))),
        merged(proposal.entropy, torch.zeros(len(ids))),
        logits=None,
    )
