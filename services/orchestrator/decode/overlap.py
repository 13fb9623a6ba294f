"""Drafting the next window while the guider verifies this one (PEARL's post-verify, overlap=true).

The verify stage asks, in the same yield as its verify calls, for the next round's proposal on the assumption that
the round accepts the first n of its drafts, for one n or several (`guesses`): one drafter call (ProposeAfter), each
guess in a span of its own, which is the forward the drafter would run for the request with those n drafts committed.
The engine's step batches it with the guider's and the filter's calls, so the drafter and the guider work at once.
The next round takes the guess whose count the round accepted, if the request it starts from is exactly the one that
guess assumed (the same canvas, commits and order; the pipeline's gate and commit draw nothing from the RNG, so the
round starts from the RNG that guess drew from): its proposal is then the one the drafter would make now, and the
output is token for token what overlap=false gives. Otherwise the round proposes as usual. A guess's forward keeps no
KV of its spans, so the drafter's cache never holds a speculative token.

guesses=1 speculates on the whole window, as PEARL does. It pays only where whole windows are accepted: on the
shipped zoo (window 16, about 8.4 tokens a round) 3 of 12 speculations held (the 5 bench prompts, both follow modes),
so the speculative forward mostly costs: served c=1, `dlm bench --concurrency 1 --strategy pipeline --max-new-tokens
48 --set overlap=true` against false on one server, alternating on a shared 2-core CPU, 0.80-0.85x. Hence off by
default. With follow=drafter a round decides the first n drafts (n >= 1), so `guesses` > 1 adds the counts the
drafter finds likeliest after the whole window (guess_counts); guesses >= window covers every count, and then a
speculation holds unless the request's state changed otherwise (an EOS, its end). Each guess adds its tokens to the
one forward: nearly free where the drafter's forward costs its kernel launches (a GPU, models this small), not on a
CPU core. Over 80 prompts of the bench's tasks (scripts/speculation_guesses.py) 16%, 39%, 52%, 62% and 100% of rounds
held at guesses 1, 2, 3, 4 and 16. On the H200's served c=1 round (drafter 3.9 ms, guider 2.8, 1.15 ms a hop, 0.8 of
orchestrator), a share h that holds saves the drafter's forward and a hop: on / off = 9.8 / (10.8 - 5.0 h), 1.3x at
h = 0.65, if the guesses' forward costs a plain proposal's there. On a 2-core CPU it costs its FLOPs (README,
Strategies: 0.65-0.89x served).
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from services.common.contract import Call, ProposeAfter, Role, Stage
from services.common.proposal import Decision, Proposal, Region, Verdict
from services.common.request import Request
from services.orchestrator.decode.commit import Commit
from services.orchestrator.decode.verify import drafts

SAME = ("tokens", "decided", "filled", "committed")  # the canvas tensors a proposal reads


@dataclass(slots=True)
class Speculation:
    ahead: Request  # the request the proposal was drafted on
    region: Region
    proposal: Proposal
    draws: int  # the request's count of draws after it (Rng.draws)

    def holds(self, req: Request, region: Region) -> bool:
        ahead = self.ahead
        if (region, req.order, req.horizon, req.state) != (self.region, ahead.order, ahead.horizon, ahead.state):
            return False
        return all(torch.equal(getattr(req, name), getattr(ahead, name)) for name in SAME)


def copied(req: Request) -> Request:
    """A copy of the request whose canvas, commits, state and RNG can change without changing it."""
    ahead = object.__new__(Request)
    for f in fields(Request):
        object.__setattr__(ahead, f.name, getattr(req, f.name))
    for name in SAME:
        setattr(ahead, name, getattr(req, name).clone())
    ahead.order, ahead.state, ahead.logprobs = list(req.order), copy.deepcopy(req.state), dict(req.logprobs)
    ahead.stats = copy.deepcopy(req.stats)
    ahead.rng = req.rng.copy()
    return ahead


def accepted(req: Request, region: Region, proposal: Proposal, commit: Commit, n: int) -> Request:
    """A copy of the request after its round accepted the first n undecided positions from the frontier, each decided
    with its draft and committed."""
    ahead = copied(req)
    span = torch.arange(req.frontier, region.end)
    undecided = span[~req.decided[span]][:n]
    commit(ahead, Decision(undecided, drafts(req, region, proposal)[undecided - req.frontier]))
    return ahead


def guess_counts(probs: torch.Tensor, guesses: int) -> list[int]:
    """probs [L], the drafter's probability of each of a window's drafts -> the accepted counts to speculate on: the
    whole window, then the likeliest others, `guesses` in all.

    The gate accepts the run of drafts the guider agrees with, at least one. Taking each draft's probability as the
    chance that it is accepted, the run is k long with probability p_1 ... p_k (1 - p_k+1); the count is max(k, 1)."""
    run = torch.cat([torch.ones(1), probs.double().cumprod(0)])  # [L + 1]: P(run >= k)
    exact = run - torch.cat([run[1:], torch.zeros(1)])  # [L + 1]: P(run == k)
    exact[1] += exact[0]
    likely = sorted(range(1, len(probs)), key=lambda n: -float(exact[n]))
    return [len(probs), *likely][:guesses]


@dataclass(slots=True)
class Guesses:
    base: Request  # a copy of the request as its round verified it
    region: Region
    proposal: Proposal
    guessed: dict[int, Proposal]  # accepted count -> the next round's proposal
    draws: int  # the request's count of draws after any one of them (each guess drew from its own copy)

    def taken(self, req: Request, region: Region, commit: Commit) -> Speculation | None:
        """The guess whose count the round accepted, if the request is the one it assumed."""
        n = len(req.order) - len(self.base.order)
        if n not in self.guessed:
            return None
        ahead = accepted(self.base, self.region, self.proposal, commit, n)
        speculation = Speculation(ahead, commit.region(ahead), self.guessed[n], self.draws)
        return speculation if speculation.holds(req, region) else None


class PostVerify:
    """The verify stage that drafts the next window at the same time, and the propose stage that takes that draft
    when it holds; one per request (a strategy's stages are built per request)."""

    def __init__(
        self,
        propose: Callable[[Request, Region], Stage[Proposal]],
        verify: Callable[[Request, Region, Proposal], Stage[Verdict]],
        commit: Commit,
        ar_head: bool,
        guesses: int = 1,
    ):
        self.inner_propose, self.inner_verify, self.commit = propose, verify, commit
        self.ar_head, self.guesses = ar_head, guesses
        self.speculation: Guesses | None = None

    def propose(self, req: Request, region: Region) -> Stage[Proposal]:
        speculation, self.speculation = self.speculation, None
        taken = speculation.taken(req, region, self.commit) if speculation is not None else None
        if taken is None:
            return (yield from self.inner_propose(req, region))
        req.rng.draws = taken.draws
        return taken.proposal

    def verify(self, req: Request, region: Region, proposal: Proposal) -> Stage[Verdict]:
        window = drafts(req, region, proposal)
        counts = self.counts(req, proposal, window)
        if not counts:
            return (yield from self.inner_verify(req, region, proposal))
        start = req.frontier
        ends = tuple(self.commit.region_at(start + n, req.horizon, req.state).end for n in counts)
        call = Call(Role.DRAFTER, ProposeAfter(req, start, window, counts, ends, self.ar_head))
        verdict, guessed = yield from together(self.inner_verify(req, region, proposal), one(call))
        guesses = dict(zip(counts, guessed.proposals, strict=True))
        self.speculation = Guesses(copied(req), region, proposal, guesses, guessed.draws)
        return verdict

    def counts(self, req: Request, proposal: Proposal, window: torch.Tensor) -> tuple[int, ...]:
        """The counts this round speculates on, none that ends the request: past a draft EOS or the canvas end."""
        eos = (window == req.eos_id).nonzero()
        usable = min(int(eos[0]) if len(eos) else len(window), req.horizon - req.frontier - 1)
        contiguous = torch.equal(proposal.positions, torch.arange(req.frontier, req.frontier + len(window)))
        # with tentative drafts in the window (follow=guider's context) only the whole window is a count of drafts
        counts = guess_counts(proposal.probs, self.guesses) if contiguous else [len(window)]
        return tuple(n for n in counts if n <= usable)


def one(call: Call) -> Stage:
    (value,) = yield [call]
    return value


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
