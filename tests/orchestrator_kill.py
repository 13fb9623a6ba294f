"""Streams through DlmClient with every chunk's arrival time, and the figures of a kill: the added latency of each
stream and its takeover time. Shared by tests/orchestrator/cluster/test_orchestrator_kill.py and
scripts/takeover_latency.py."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

PROMPT = "count from 1 to 9:"
CASES = {  # strategy -> params: the causal drafter's three, then the bidirectional one's
    "pipeline": {"window": 6},
    "streaming": {"window": 6},
    "slot": {"slot_size": 4, "block_size": 8, "kv": "recompute"},
    "guided": {"block_size": 8},
}


@dataclass
class Streamed:
    ids: list[int] = field(default_factory=list)
    text: str = ""
    reason: int | None = None
    start: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each chunk

    @property
    def seconds(self) -> float:
        return self.arrivals[-1] - self.start

    def takeover(self, kill: float) -> float:
        """Seconds from the kill to the chunk that ended the stream's longest silence (the first resumed one)."""
        times = [self.start, *self.arrivals]
        gaps = [(b - a, b) for a, b in zip(times, times[1:], strict=False) if b > kill]
        return max(gaps)[1] - kill


def run_streams(client, cases: list[tuple[str, dict]], tokens: int, seed: int, started=None) -> list[Streamed]:
    """One seeded stream at temperature 0.8 per (strategy, params), at once; started[i] is set at stream i's first
    chunk."""
    started = started or [threading.Event() for _ in cases]

    def one(i: int, strategy: str, params: dict) -> Streamed:
        out = Streamed(start=time.monotonic())
        sampling = {"seed": seed + i, "temperature": 0.8, "request_id": f"kill-{seed}-{i}"}
        for event in client.stream(PROMPT, strategy=strategy, params=params, max_new_tokens=tokens, **sampling):
            if hasattr(event, "finish_reason"):
                out.reason = event.finish_reason
            elif hasattr(event, "token_ids"):
                out.ids += event.token_ids
                out.text += event.text
                out.arrivals.append(time.monotonic())
                started[i].set()
        return out

    with ThreadPoolExecutor(len(cases)) as pool:
        futures = [pool.submit(one, i, s, p) for i, (s, p) in enumerate(cases)]
        return [f.result() for f in futures]


def killed_streams(client, cases: list[tuple[str, dict]], tokens: int, seed: int, kill) -> tuple[list[Streamed], float]:
    """run_streams, with kill() called once every stream has its first chunk -> (streams, time of the kill)."""
    started = [threading.Event() for _ in cases]
    with ThreadPoolExecutor(1) as pool:
        streams = pool.submit(run_streams, client, cases, tokens, seed, started)
        for event in started:
            assert event.wait(120), "a stream never started"
        killed = time.monotonic()
        kill()
        return streams.result(timeout=300), killed


def figures(calm: list[Streamed], disturbed: list[Streamed], killed: float) -> dict[str, float]:
    """Added latency (disturbed - calm seconds) and takeover time over the streams: p50 and max."""
    added = sorted(d.seconds - c.seconds for d, c in zip(disturbed, calm, strict=True))
    takeover = sorted(d.takeover(killed) for d in disturbed)
    mid = len(added) // 2
    return {
        "added_p50": added[mid],
        "added_max": added[-1],
        "takeover_p50": takeover[mid],
        "takeover_max": takeover[-1],
    }
