"""Where a round's milliseconds go, from a traces file (OTEL_DLM_TRACES_FILE, services/common/tracing.py): each
`dlm.round` span and the stage spans under it, recorded where each call ran (in process or on its replica). Per
round, in the order things happen: from the round's start to its first stage call (the orchestrator, then the hop
out); each phase of stage calls (one phase: the calls of a step that run at the same time, e.g. guider.verify with
filter.accept_probs) and the gap before the next phase (the hop back, the orchestrator, the hop out); from the last
call's end to the round's end (the hop back, the gate and commit). Medians over rounds, milliseconds.
`PYTHONPATH=. python scripts/round_breakdown.py TRACES.jsonl [MORE.jsonl ...]`

Taken with, e.g., `OTEL_DLM_TRACES_FILE=/tmp/t.jsonl dlm bench --concurrency 1 --strategy pipeline` (in process) or the
same variable exported before `dlm serve` (the replicas write their stage spans there too) and `dlm bench --target`.

One run on a shared 2-core CPU, pipeline c=1, 48 new tokens, 89 rounds each, traced (the file exporter slows every
round), in order: in process (DLM_THREADS=1), served through Serve handles (before 4f53cda), served on the replicas'
actors (after), in process again. Median ms:
                                in process   served, Serve   served, actors   in process
  start -> first call                 0.21            3.46             2.87         0.92
  drafter.propose                    15.19           13.65            12.08        29.28
  gap (hop back, gate, hop out)       0.91            6.21             6.14         5.32
  guider.verify (+ filter)            3.86            9.07 (together)  10.26 (together) 9.10
  last call -> round end              0.74            2.52             2.67         2.59
  round                              29.95           36.44            36.55        53.29
The same at c=16 (285 rounds each; tok/s 1251 / 1004 / 1079 / 1466):
  start -> first call                 0.73            8.89            14.08         0.65
  drafter.propose                    57.07           26.75            36.74        54.53
  gap (hop back, gate, hop out)       1.91           11.24             8.29         1.76
  guider.verify (+ filter)           20.75           15.06 (together)  13.83 (together) 20.03
  last call -> round end              5.08            4.77             5.12         4.74
  round                              86.78           69.04            77.24        83.72
(served, "start -> first call" includes the wait for the other micro-batch's call on the drafter's one host thread).
The hops stay about 2.5-3 ms each way on the replicas' actors: the cost is the wake-ups of the orchestrator's loop and
the replicas' threads on a loaded machine, not Serve's router."""

import json
import statistics
import sys
from collections import defaultdict
from datetime import datetime


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def spans(paths: list[str]) -> list[dict]:
    out = []
    for path in paths:
        with open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def phases(calls: list[dict]) -> list[list[dict]]:
    """Stage calls grouped by overlap in time: a phase is calls that ran at once."""
    out: list[list[dict]] = []
    for call in sorted(calls, key=lambda s: s["start"]):
        if out and call["start"] < max(c["end"] for c in out[-1]):
            out[-1].append(call)
        else:
            out.append([call])
    return out


def breakdown(all_spans: list[dict]) -> dict[str, list[float]]:
    for s in all_spans:
        s["start"], s["end"] = seconds(s["start_time"]), seconds(s["end_time"])
    children = defaultdict(list)
    for s in all_spans:
        if s.get("parent_id"):
            children[s["parent_id"]].append(s)
    rows: dict[str, list[float]] = defaultdict(list)
    for r in (s for s in all_spans if s["name"] == "dlm.round"):
        calls = [c for c in children[r["context"]["span_id"]] if c["name"] != "dlm.round"]
        if not calls:
            continue
        steps = phases(calls)
        ms = []
        ms.append(("start -> first call", steps[0][0]["start"] - r["start"]))
        for i, step in enumerate(steps):
            names = "+".join(sorted({c["name"] for c in step}))
            ms.append((f"{i + 1}: {names}", max(c["end"] for c in step) - min(c["start"] for c in step)))
            if i + 1 < len(steps):
                ms.append((f"gap after {i + 1}", steps[i + 1][0]["start"] - max(c["end"] for c in step)))
        ms.append(("last call -> round end", r["end"] - max(c["end"] for c in steps[-1])))
        ms.append(("round", r["end"] - r["start"]))
        for name, value in ms:
            rows[name].append(1000 * value)
    return rows


def main() -> None:
    rows = breakdown(spans(sys.argv[1:]))
    rounds = len(rows.get("round", []))
    print(f"{rounds} rounds; median ms (rounds with that row)")
    for name, values in rows.items():
        print(f"{name:48} {statistics.median(values):8.2f}  ({len(values)})")


if __name__ == "__main__":
    main()
