"""Is a model's forward slower on its Serve replica than in process, and is it an idle gap before the call that makes
it so? A served c=1 round's forwards took 10-60% longer on their replicas than in process on a lent H200, their
threads on a core the whole time (README, "On a GPU"). This replays the calls of one mid-decode `pipeline` round
(the drafter's propose, then the guider's verify, captured from a c=1 request decoded in process) on the in-process
hosts and, through each replica's channel, on the replicas of the app `dlm serve` deploys (served here, as `dlm serve
--config CONFIG` serves it): back to back, and each call after GAP_MS of idle, about the other stage's turn at c=1.
Per host it prints the median compute (the host's own timing, as `dlm bench --breakdown` reads it) and, served, the
round trip. On CPU give the in-process forwards the replicas' threads (DLM_THREADS=1: serving.replica_threads); the
replicas' environment (cluster/app.py, REPLICA_ENV), set for this script, gives them the replicas' malloc and OpenMP.
`PYTHONPATH=. python scripts/device/replica_forward.py CONFIG [CALLS] [GAP_MS]`"""

import asyncio
import pickle
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

from ray import serve

from services.cli.serve import index_redis, ray_serving
from services.cli.serve_config import APP
from services.common.config import EngineConfig
from services.common.contract import ROLES, Args, Groups, Reply
from services.common.params import BENCH_PROMPTS
from services.orchestrator.engine.engine import Engine
from services.serving.direct import DirectHandle  # also registers the compact pickling of the calls

Call = Callable[[], Awaitable[list[Reply]]]


def one_round(engine: Engine, roles: tuple[str, ...] = ("drafter", "guider")) -> Groups:
    """The model calls of these roles in the second round (propose, then verify with the filter) of a c=1 request,
    decoded here."""
    phases: list[Groups] = []
    run = engine.executor.run

    def kept(groups, parents):
        phases.append(pickle.loads(pickle.dumps(groups)))  # as the call sent it: the request goes on decoding
        return run(groups, parents)

    engine.executor.run = kept
    engine.generate(BENCH_PROMPTS[0], "pipeline", {}, 48)
    engine.executor.run = run
    if len(phases) < 4:
        raise SystemExit(f"the request ended in {len(phases)} phases; this needs a second round")
    return {key: args for phase in phases[2:4] for key, args in phase.items() if key[0] in roles}


async def timed(call: Call, calls: int, gap_s: float) -> tuple[list[float], list[float]]:
    """-> (compute, round trip) per call, after a warm-up call (it rebuilds the request's KV where none is held)."""
    await call()
    compute, trip = [], []
    for _ in range(calls):
        if gap_s:
            await asyncio.sleep(gap_s)
        start = time.perf_counter()
        replies = await call()
        trip.append(time.perf_counter() - start)
        compute.append(replies[0].compute.end - replies[0].compute.start)
    return compute, trip


def in_process(engine: Engine, role: str, method: str, args: list[Args]) -> Call:
    """The call as the in-process engine makes it (LocalExecutor.execute, on its step thread)."""

    async def call() -> list[Reply]:
        replies = (await engine.executor.execute({(role, method): args}))[role, method]
        if isinstance(replies, BaseException):
            raise replies
        return replies

    return call


def served(handle: DirectHandle, method: str, args: list[Args]) -> Call:
    return lambda: handle.run.remote(method, args, None)


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):7.2f}"


async def compare(engine: Engine, calls_of: Groups, calls: int, gap_ms: float) -> None:
    print(f"{'host':10s} {'where':12s} {'gap ms':>7s} {'compute':>7s} {'trip':>7s}   (ms, median of {calls})")
    for (role, method), args in calls_of.items():
        handle = DirectHandle(serve.get_deployment_handle(ROLES[role].host, app_name=APP), ROLES[role].host)
        for gap in (0.0, gap_ms):
            for where, call in (
                ("in process", in_process(engine, role, method, args)),
                ("replica", served(handle, method, args)),
            ):
                compute, trip = await timed(call, calls, gap / 1000)
                print(f"{role:10s} {where:12s} {gap:7.1f} {ms(compute)} {ms(trip)}")
        await handle.handle.release.remote(ROLES[role].host, [call.req.id for call in args])  # the KV it rebuilt


def main(config_path: str, calls: int, gap_ms: float) -> None:
    config = EngineConfig.from_yaml(config_path)
    engine = Engine(config)
    calls_of = one_round(engine)  # before the event loop: the engine's own step runs one
    print(f"in-process torch threads {config.threads or 'default'}; replicas' {config.serving.replica_threads} on CPU")
    with index_redis(config.serving), ray_serving(config):
        asyncio.run(compare(engine, calls_of, calls, gap_ms))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]) if len(args) > 1 else 100, float(args[2]) if len(args) > 2 else 8.0)
