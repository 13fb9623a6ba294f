"""CPU seconds per generated token, in process and served, by process. Where a load level keeps this machine's cores
busy, tok/s is (busy cores) / (CPU per token), so this says where a served token's extra cost goes.

In process: this process's CPU (getrusage) over `dlm bench --concurrency C`'s closed loop on the engine. Served:
every process's CPU on this machine (/proc/PID/stat) over the same loop against `dlm serve` at --target, this
client included, grouped by Ray actor. Each form runs one warm-up level, then LEVELS timed ones.
`PYTHONPATH=. python scripts/cpu_per_token.py [--target 127.0.0.1:50051] [--concurrency 16] [--levels 3]`

Shipped zoo, `pipeline`, 48 tokens, c=16, a shared 2-core CPU, 3 levels each (one run, 2026-11-27: in process,
served, in process): in process 1770-2216 tok/s on 1.80-1.95 busy cores, 0.88-1.03 CPU ms a token; served 820-1057
tok/s on 1.78-1.84 cores, 1.69-2.26 ms a token: drafter 0.67-0.92, orchestrator 0.43-0.54, guider 0.30-0.38,
client 0.09-0.11, Ray's own processes 0.06-0.1, Redis 0.04-0.05, filter 0.03-0.05."""

import argparse
import os
import re
import resource
import time
from collections import Counter

from services.cli.load import LoadRow
from services.common.params import BENCH_PROMPTS

TICKS = os.sysconf("SC_CLK_TCK")
KWARGS = {"strategy": "pipeline", "max_new_tokens": 48}


def processes() -> dict[int, tuple[float, str]]:
    """pid -> (CPU seconds so far, its name: the Ray actor's, else the executable's)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state is field 3, utime 14, stime 15
        actor = re.search(r"ray::([\w:]+)", cmd)
        name = "this client" if int(pid) == os.getpid() else actor[1] if actor else os.path.basename(cmd.split(" ")[0])
        out[int(pid)] = ((int(fields[11]) + int(fields[12])) / TICKS, name or "?")
    return out


def report(form: str, row: LoadRow, wall: float, by_process: Counter) -> None:
    cpu = sum(by_process.values())
    print(
        f"{form} c={row.concurrency}: {row.tokens_per_s:.0f} tok/s, {cpu / wall:.2f} busy cores, "
        f"{1000 * cpu / row.tokens:.3f} CPU ms a token"
    )
    if len(by_process) > 1:
        for name, seconds in by_process.most_common(8):
            print(f"    {name:32s} {1000 * seconds / row.tokens:.3f}")


def in_process(concurrency: int, levels: int) -> None:
    from services.cli.load import engine_level
    from services.common.config import DEFAULT_CONFIG, EngineConfig
    from services.orchestrator.engine.engine import Engine

    engine = Engine(EngineConfig.from_yaml(DEFAULT_CONFIG))
    for level in range(levels + 1):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        row, _ = engine_level(engine, concurrency, BENCH_PROMPTS, KWARGS["strategy"], {}, KWARGS["max_new_tokens"])
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        if level:  # the first one warms up
            report("in process", row, wall, Counter({"this process": cpu}))


def served(target: str, concurrency: int, levels: int) -> None:
    from services.cli.client import DlmClient
    from services.cli.remote_cli import load_level

    with DlmClient(target) as client:
        client.wait_ready()
        for level in range(levels + 1):
            before, start = processes(), time.perf_counter()
            row, _ = load_level(client, concurrency, BENCH_PROMPTS, KWARGS)
            after, wall = processes(), time.perf_counter() - start
            by_process = Counter()
            for pid, (seconds, name) in after.items():
                by_process[name] += seconds - before.get(pid, (0.0, name))[0]
            if level:
                report("served", row, wall, +by_process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="a `dlm serve` on this machine; without it, in process")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--levels", type=int, default=3)
    args = parser.parse_args()
    if args.target:
        served(args.target, args.concurrency, args.levels)
    else:
        in_process(args.concurrency, args.levels)


if __name__ == "__main__":
    main()
