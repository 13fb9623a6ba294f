"""Drafting the next window while the guider verifies this one (PEARL's post-verify, overlap=true).

The verify stage asks, in the same yield as its verify calls, for the next round's proposal on a copy of the request
that has this round's drafts accepted and committed. The engine's step batches those calls with the guider's and the
filter's, so the drafter and the guider work at once. The next round takes that proposal only if the request it
starts from is exactly the copy it was drafted on (the same canvas, commits and order; the pipeline's gate and commit
draw nothing from the RNG, so the round starts from the RNG the proposal was drawn from): the proposal is then the
one the drafter would make now, and the output is token for token what overlap=false gives. Otherwise the proposal is
dropped and the round proposes as usual; the causal drafter's cache drops the speculative commits it holds at its next
forward (services/dlm_drafter/causal.py, roll_back).

It pays only where whole windows are accepted. On the shipped zoo (window 16, about 8.4 tokens a round) 3 of 12
speculations held (the 5 bench prompts, both follow modes), so the speculative forward mostly costs: served c=1,
`dlm bench --concurrency 1 --strategy pipeline --max-new-tokens 48 --set overlap=true` against false on one server,
alternating on a shared 2-core CPU, 0.80-0.85x. Hence off by default.

Guessing the gate's decision instead of a whole window holds little more often, measured and not built. With
follow=drafter a round decides the first n drafts, so a guess is a count, read from what the proposal carries when
the speculation goes out (the verdict and the filter's scores come back in that step). Over 80 prompts of the bench's
tasks (198 rounds, `scripts/speculation_guesses.py`), whole windows were accepted in 16% of rounds, the best guess
(the run of drafts above 0.7 drafter probability) held in 33%, and the best three guesses together in 49%. On the
H200's served c=1 round (drafter 3.9 ms, guider 2.8, 1.15 ms a hop, 0.8 of orchestrator), a share h of speculations
that hold gives on / off = 9.8 / (10.8 - 5.0 h): 1.04x at the bench prompts' 27% of whole windows (their 11 rounds:
`speculation_guesses.py bench`), as measured there, and 1.3x needs h = 0.65.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from services.common.contract import Stage
from services.common.proposal import Decision, Proposal, Region, Verdict
from services.common.request import Request
from services.orchestrator.decode.commit import Commit

SAME = ("tokens", "decided", "filled", "committed")  # the canvas tensors a proposal reads


@dataclass(slots=True)
class Speculation:
    ahead: Request  # the request the proposal was drafted on
    region: Region
    proposal: Proposal
    generator: torch.Generator  # the RNG after it

    def holds(self, req: Request, region: Region) -> bool:
        ahead = self.ahead
        if (region, req.order, req.horizon, req.state) != (self.region, ahead.order, ahead.horizon, ahead.state):
            return False
        return all(torch.equal(getattr(req, name), getattr(ahead, name)) for name in SAME)


def accepted(req: Request, region: Region, proposal: Proposal, commit: Commit) -> Request:
    """A copy of the request after a full acceptance: every undecided position from the frontier to the region's end
    decided with the draft there (the proposal, or a kept tentative draft) and committed."""
    ahead = object.__new__(Request)
    for f in fields(Request):
        object.__setattr__(ahead, f.name, getattr(req, f.name))
    for name in SAME:
        setattr(ahead, name, getattr(req, name).clone())
    ahead.order, ahead.state, ahead.logprobs = list(req.order), copy.deepcopy(req.state), dict(req.logprobs)
    ahead.stats = copy.deepcopy(req.stats)
    ahead.generator = torch.Generator().set_state(req.generator.get_state())
    ahead.tokens[proposal.positions] = proposal.ids
    span = torch.arange(req.frontier, region.end)
    undecided = span[~req.decided[span]]
    commit(ahead, Decision(undecided, ahead.tokens[undecided]))
    return ahead


class PostVerify:
    """The verify stage that drafts the next window at the same time, and the propose stage that takes that draft
    when it holds; one per request (a strategy's stages are built per request)."""

    def __init__(
        self,
        propose: Callable[[Request, Region], Stage[Proposal]],
        verify: Callable[[Request, Region, Proposal], Stage[Verdict]],
        commit: Commit,
    ):
        self.inner_propose, self.inner_verify, self.commit = propose, verify, commit
        self.speculation: Speculation | None = None

    def propose(self, req: Request, region: Region) -> Stage[Proposal]:
        speculation, self.speculation = self.speculation, None
        if speculation is not None and speculation.holds(req, region):
            req.generator = speculation.generator
            return speculation.proposal
        return (yield from self.inner_propose(req, region))

    def verify(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        ahead = accepted(req, region, proposal, self.commit)
        next_region = self.commit.region(ahead)
        if ahead.finished or next_region.start >= next_region.end:
            return (yield from self.inner_verify(req, region, proposal))
        own = req.generator
        verdict, drafted = yield from together(
            self.inner_verify(req, region, proposal), self.inner_propose(ahead, next_region)
        )
        # the engine hands a call's RNG to the round's request (engine/rounds.py, account): the speculative
        # proposal's belongs to the speculation
        self.speculation = Speculation(ahead, next_region, drafted, req.generator)
        req.generator = own
        return verdict


def together(first: Stage, second: Stage) -> Stage[tuple]:
    """Two stages whose calls go out in the same yields, so that the step runs them in the same batched calls at once
    -> both stages' values."""
    stages, pending, values = [first, second], [None, None], [None, None]
    live = [True, True]

    def advance(i: int, sent) -> None:
        try:
            pending[i] = stages[i].send(sent)
        except StopIteration as stop:
            live[i], values[i] = False, stop.value

    advance(0, None)
    advance(1, None)
    while any(live):
        calls = [call for i in (0, 1) if live[i] for call in pending[i]]
        replies = yield calls
        at = 0
        for i in (0, 1):
            if live[i]:
                n = len(pending[i])
                advance(i, replies[at : at + n])
                at += n
    return values[0], values[1]
