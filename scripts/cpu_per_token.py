"""CPU seconds per generated token, in process and served, by process. Where a load level keeps this machine's cores
busy, tok/s is (busy cores) / (CPU per token), so this says where a served token's extra cost goes.

In process: this process's CPU (its threads', /proc/self/task) over `dlm bench --concurrency C`'s closed loop on the
engine, split into the engine's thread (the steps, the decode stages, the loop) and the forwards'. Served:
every process's CPU on this machine (/proc/PID/stat) over the same loop against `dlm serve` at --target, this
client included, grouped by Ray actor. Each form runs one warm-up level, then LEVELS timed ones.
`PYTHONPATH=. python scripts/cpu_per_token.py [--target 127.0.0.1:50051 [--idle 20]] [--concurrency 16] [--levels 3]`;
--idle first reports the CPU the serving stack spends with no load, by process, over that many seconds.

Shipped zoo, `pipeline`, 48 tokens, c=16, a shared 2-core CPU, 3 levels each (one run, 2026-11-29: in process,
served with --idle 20, in process): in process 2446-2677 tok/s on 1.83-1.87 busy cores, 0.691-0.755 CPU ms a token
(the forwards 0.649-0.708, the engine's thread 0.042-0.051); served 1486-1542 tok/s on 1.80-1.85 cores, 1.168-1.252
ms a token: drafter 0.50-0.52, orchestrator 0.26-0.27, guider 0.22, client 0.07, filter 0.03, Redis and Ray's
controller 0.02-0.025 each; idle, 20% of a core. 18.5 tokens a request."""

import argparse
import os
import re
import threading
import time
from collections import Counter

from services.cli.load import LoadRow
from services.common.params import BENCH_PROMPTS

TICKS = os.sysconf("SC_CLK_TCK")
KWARGS = {"strategy": "pipeline", "max_new_tokens": 48}


def stat_cpu(path: str) -> float:
    """CPU seconds so far of the process or thread whose /proc stat file this is (OSError once it ended)."""
    with open(path) as f:
        stat = f.read()
    fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state is field 3, utime 14, stime 15
    return (int(fields[11]) + int(fields[12])) / TICKS


def processes() -> dict[int, tuple[float, str]]:
    """pid -> (CPU seconds so far, its name: the Ray actor's, else the executable's)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            seconds = stat_cpu(f"/proc/{pid}/stat")
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:  # it ended meanwhile
            continue
        actor = re.search(r"ray::([\w:]+)", cmd)
        name = "this client" if int(pid) == os.getpid() else actor[1] if actor else os.path.basename(cmd.split(" ")[0])
        out[int(pid)] = (seconds, name or "?")
    return out


def spent(before: dict[int, tuple[float, str]], after: dict[int, tuple[float, str]]) -> Counter:
    """Two processes() snapshots -> CPU seconds between them, by name."""
    by_process = Counter()
    for pid, (seconds, name) in after.items():
        by_process[name] += seconds - before.get(pid, (0.0, name))[0]
    return +by_process


def idle(seconds: float) -> Counter:
    """CPU seconds every process on this machine spends over `seconds` in which this one waits, by name."""
    before = processes()
    time.sleep(seconds)
    return spent(before, processes())


def threads() -> dict[int, float]:
    """This process's threads: thread id -> CPU seconds so far."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = stat_cpu(f"/proc/self/task/{tid}/stat")
        except OSError:  # it ended meanwhile
            continue
    return out


def report(form: str, row: LoadRow, wall: float, by_process: Counter) -> None:
    cpu = sum(by_process.values())
    print(
        f"{form} c={row.concurrency}: {row.tokens_per_s:.0f} tok/s, {cpu / wall:.2f} busy cores, "
        f"{1000 * cpu / row.tokens:.3f} CPU ms a token, {row.tokens / row.requests:.1f} tokens a request"
    )
    if len(by_process) > 1:
        for name, seconds in by_process.most_common(8):
            print(f"    {name:32s} {1000 * seconds / row.tokens:.3f}")


def in_process(concurrency: int, levels: int) -> None:
    from services.cli.load import engine_level
    from services.common.config import DEFAULT_CONFIG, EngineConfig
    from services.orchestrator.engine.engine import Engine

    engine, main = Engine(EngineConfig.from_yaml(DEFAULT_CONFIG)), threading.get_native_id()
    for level in range(levels + 1):
        before, start = threads(), time.perf_counter()
        row, _ = engine_level(engine, concurrency, BENCH_PROMPTS, KWARGS["strategy"], {}, KWARGS["max_new_tokens"])
        after, wall = threads(), time.perf_counter() - start
        by_thread = Counter()  # the engine steps on this thread; the hosts' forwards run on the executor's and torch's
        for tid, seconds in after.items():
            by_thread["the engine (its thread)" if tid == main else "the forwards"] += seconds - before.get(tid, 0.0)
        if level:  # the first one warms up
            report("in process", row, wall, by_thread)


def served(target: str, concurrency: int, levels: int, idle_s: float) -> None:
    from services.cli.client import DlmClient
    from services.cli.remote_cli import load_level

    with DlmClient(target) as client:
        client.wait_ready()
        if idle_s:
            by_process = idle(idle_s)
            print(f"served idle: {100 * sum(by_process.values()) / idle_s:.1f}% of a core over {idle_s:g} s")
            for name, seconds in by_process.most_common(8):
                print(f"    {name:32s} {100 * seconds / idle_s:.1f}%")
        for level in range(levels + 1):
            before, start = processes(), time.perf_counter()
            row, _ = load_level(client, concurrency, BENCH_PROMPTS, KWARGS)
            after, wall = processes(), time.perf_counter() - start
            if level:
                report("served", row, wall, spent(before, after))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a `dlm serve` on this machine; without it, in process")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--idle", type=float, default=0.0, help="with --target: seconds to measure it with no load")
    args = parser.parse_args()
    if args.idle and not args.target:
        parser.error("--idle measures a server: give --target")
    if args.target:
        served(args.target, args.concurrency, args.levels, args.idle)
    else:
        in_process(args.concurrency, args.levels)


if __name__ == "__main__":
    main()
