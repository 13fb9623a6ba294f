"""The fastest c=1 round that any split of the models over processes reaches on this machine: the least a served round
costs, whatever its orchestrator, transport and Ray do. It replays one mid-decode `pipeline` round's calls (the
drafter's propose, then the guider's verify and the filter's accept_probs at once, as a served step sends them;
captured as scripts/device/replica_forward.py captures them) on the hosts themselves, with nothing between them but
a pipe and a byte:

- in process: every host in this process, on one team of THREADS torch threads, its calls one after another (the
  in-process engine's forwards);
- split: each host in a process of its own, as each model replica holds its model, with 1 thread (the replicas'
  `serving.replica_threads`), and with THREADS threads each, their OpenMP teams sleeping between ops
  (`OMP_WAIT_POLICY=PASSIVE`, the replicas' environment) or spinning a while first (`GOMP_SPINCOUNT`).

Split, each process idles while the others compute, as at served c=1. The arguments cross to each process once,
before the rounds, so a split round pays only its forwards and a wake-up per call. Served c=1 tok/s is then at most
the in-process round over the best split's times the in-process tok/s: a served round adds its orchestrator and its
hops, and a request its way in and out, on top of the split's forwards. A served round also computes beside Ray
Serve's own processes: run this beside an idle `dlm serve` for the split a served round can reach (README, "The floor
at c=1").
`PYTHONPATH=. python scripts/split_floor.py [ROUNDS] [THREADS]`"""

import multiprocessing
import os
import pickle
import statistics
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from multiprocessing.connection import Connection
from unittest.mock import patch

from services.common.compute import timed_call
from services.common.config import EngineConfig
from services.common.contract import ROLES, Args, Groups
from services.common.threads import DEFAULT_THREADS, intra_op_threads
from services.orchestrator.engine.hosts import Host, HostPool
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving import pickling  # noqa: F401  the calls' compact pickling, here and in each host's process

CONFIG = "configs/dlm.yaml"
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
SPINNING = {"GOMP_SPINCOUNT": "30000"}  # the team spins through the gaps between ops, then sleeps between calls
PHASES = (("drafter",), ("guider", "filter"))  # a served pipeline round's: the calls of a phase go out at once

Started = Callable[[], float]  # waits for a call it started; -> the host's compute in seconds
Call = Callable[[], Started]  # starts a call


def captured_round(threads: int) -> tuple[LocalExecutor, Groups]:
    """The in-process engine's executor, its forwards on `threads`, and the calls of a c=1 request's second round,
    decoded there."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "device"))
    from replica_forward import one_round

    from services.orchestrator.engine.engine import Engine

    engine = Engine(replace(EngineConfig.from_yaml(CONFIG), threads=threads))
    return engine.executor, one_round(engine, tuple(role for phase in PHASES for role in phase))


def host_process(conn: Connection, key: tuple[str, str], threads: int) -> None:
    """One host in this process: its call, then the call again at each byte that comes; each reply its compute."""
    intra_op_threads(threads)
    role, method = key
    name = ROLES[role].host
    host = HostPool(EngineConfig.from_yaml(CONFIG)).host(name)
    args = pickle.loads(conn.recv_bytes())
    computed(host, name, method, args)  # the first call rebuilds the request's KV
    conn.send_bytes(b"ready")
    while conn.recv_bytes():
        conn.send_bytes(struct.pack("d", computed(host, name, method, args)))


def computed(host: Host, name: str, method: str, args: list[Args]) -> float:
    """The call, as a host runs it; -> its compute in seconds, as the host timed it."""
    compute = timed_call(host, name, method, args)[0].compute
    return compute.end - compute.start


def timed_rounds(phases: list[list[Call]], rounds: int) -> tuple[float, ...]:
    """-> median ms of a round (its phases one after another, each phase's calls at once), then of each call's
    compute, in order."""
    totals, computes = [], [[] for phase in phases for _ in phase]
    for _ in range(rounds):
        start, done = time.perf_counter(), []
        for phase in phases:
            done.extend(started() for started in [call() for call in phase])
        totals.append(time.perf_counter() - start)
        for compute, value in zip(computes, done, strict=True):
            compute.append(value)
    return ms(totals), *(ms(compute) for compute in computes)


def split(round_calls: Groups, rounds: int, threads: int, env: dict[str, str]) -> tuple[float, ...]:
    """-> median ms of a round, and of each host's compute in it, with each host in a process of its own. env: for
    the processes started, as libgomp reads its settings when it loads."""
    spawn = multiprocessing.get_context("spawn")
    ends, processes = {}, []
    with patch.dict(os.environ, env):
        for key, args in round_calls.items():
            here, there = spawn.Pipe()
            process = spawn.Process(target=host_process, args=(there, key, threads), daemon=True)
            process.start()
            here.send_bytes(pickle.dumps(args))
            ends[key] = here
            processes.append(process)
    for end in ends.values():
        assert end.recv_bytes() == b"ready"
    times = timed_rounds([[partial(wake, ends[key]) for key in phase] for phase in phases(round_calls)], rounds)
    for end, process in zip(ends.values(), processes, strict=True):
        end.send_bytes(b"")
        process.join()
    return times


def wake(end: Connection) -> Started:
    end.send_bytes(b"go")
    return lambda: struct.unpack("d", end.recv_bytes())[0]


def phases(round_calls: Groups) -> list[list[tuple[str, str]]]:
    """The round's call keys, by phase."""
    return [[key for key in round_calls if key[0] in roles] for roles in PHASES]


def in_process(executor: LocalExecutor, round_calls: Groups, rounds: int) -> tuple[float, ...]:
    """-> the same medians with every host in this process, on the engine's forwards' thread and its team."""

    def call(key: tuple[str, str]) -> Call:
        role, method = key
        name = ROLES[role].host

        def start() -> Started:  # the host runs the call here and now, as the in-process executor runs it
            compute = computed(executor.host(name), name, method, round_calls[key])
            return lambda: compute

        return start

    return executor.call_on_worker(
        timed_rounds, [[call(key) for key in phase] for phase in phases(round_calls)], rounds
    )


def ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


def main(rounds: int, threads: int) -> None:
    executor, round_calls = captured_round(threads)
    forms = [
        (f"in process, {threads} threads", lambda: in_process(executor, round_calls, rounds)),
        ("split, 1 thread each", lambda: split(round_calls, rounds, 1, PASSIVE)),
        (f"split, {threads} each, passive", lambda: split(round_calls, rounds, threads, PASSIVE)),
        (f"split, {threads} each, spinning", lambda: split(round_calls, rounds, threads, SPINNING)),
        (f"in process, {threads} threads", lambda: in_process(executor, round_calls, rounds)),
    ]
    roles = [role for phase in phases(round_calls) for role, _ in phase]
    print(f"{'c=1 round, ms (median of ' + str(rounds) + ')':34s} {'round':>7s} " + " ".join(f"{r:>7s}" for r in roles))
    rows = []
    for name, measure in forms:
        rows.append((name, measure()))
        print(f"{name:34s} " + " ".join(f"{value:7.2f}" for value in rows[-1][1]))
    inside = max(times[0] for name, times in rows if name.startswith("in process"))  # the slower: an upper bound
    best = min(times[0] for name, times in rows if name.startswith("split"))
    print(f"best split {best:.2f} ms against {inside:.2f} in process: served c=1 at most {inside / best:.2f}x")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 200, int(args[1]) if len(args) > 1 else DEFAULT_THREADS)
