"""One round of one request: region -> propose -> verify -> gate -> commit. Every strategy is a configuration of
these stages (strategies.py). The round is a generator: it yields the model calls each stage needs
(services/common/contract.py) and gets their values back from the engine's step, which batches every live request's
calls to the same host method into one call (services/orchestrator/engine/rounds.py)."""

from services.common.contract import Stage
from services.common.proposal import Committed
from services.common.request import Request
from services.orchestrator.decode.strategies import Stages


def one_round(req: Request, stages: Stages) -> Stage[Committed]:
    region = stages.commit.region(req)
    proposal = yield from stages.propose(req, region)
    verdict = (yield from stages.verify(req, region, proposal)) if stages.verify else None
    decision = stages.gate(req, region, proposal, verdict)
    req.stats.proposed.append(len(proposal.positions))
    return stages.commit(req, decision)
