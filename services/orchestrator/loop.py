"""The round loop: propose -> verify -> gate -> commit, the same whether stages are local or remote."""

from collections.abc import Iterator

from services.common.proposal import Committed
from services.common.request import Request
from services.orchestrator.strategies import Stages


def step(req: Request, stages: Stages) -> Committed:
    region = stages.commit.region(req)
    proposal = stages.propose(req, region)
    verdict = stages.verify(req, region, proposal) if stages.verify else None
    return stages.commit(req, stages.gate(req, region, proposal, verdict))


def decode(req: Request, stages: Stages) -> Iterator[Committed]:
    try:
        while not req.finished:
            yield step(req, stages)
    finally:
        stages.release(req.id)
        req.stats.finish()
