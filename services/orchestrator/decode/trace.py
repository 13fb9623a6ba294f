"""One request's decoding, round by round, for `dlm generate --trace-png/--trace-json`: what the drafter proposed,
what the gate decided, and the frontier. Recorded by wrapping the request's gate, so decoding is unchanged."""

from dataclasses import asdict, dataclass, field

from services.common.proposal import Decision, Proposal, Region, Verdict
from services.common.request import Request
from services.orchestrator.decode.strategies import Gate


@dataclass(slots=True)
class RoundRecord:
    round: int  # 1-based
    proposed: list[int]  # output positions the drafter proposed this round
    decided: list[int]  # those the gate made final
    frontier: int  # first undecided output position after the round


@dataclass(slots=True)
class DecodingTrace:
    strategy: str
    rounds: list[RoundRecord] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)  # per committed output token: position, round, token_id, text

    def to_dict(self) -> dict:
        return asdict(self)


class RecordingGate:
    def __init__(self, gate: Gate, trace: DecodingTrace):
        self.gate, self.trace = gate, trace

    def __call__(self, req: Request, region: Region, proposal: Proposal, verdict: Verdict | None) -> Decision:
        decision = self.gate(req, region, proposal, verdict)
        decided = req.decided.clone()
        decided[decision.positions] = True
        undecided = (~decided[: req.horizon]).nonzero()
        frontier = int(undecided[0]) if len(undecided) else req.horizon
        record = RoundRecord(
            len(self.trace.rounds) + 1, proposal.positions.tolist(), decision.positions.tolist(), frontier
        )
        self.trace.rounds.append(record)
        return decision


def finish(trace: DecodingTrace, req: Request, decode) -> DecodingTrace:
    """After the request ended: one entry per committed output token, with the round that decided it."""
    decided_in = {p: r.round for r in trace.rounds for p in r.decided}
    trace.tokens = [
        {"position": p, "round": decided_in[p], "token_id": t, "text": decode([t])}
        for p, t in enumerate(req.output_ids())
    ]
    return trace
