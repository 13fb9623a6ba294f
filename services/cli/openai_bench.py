"""`dlm bench --target http://HOST:PORT`: `vllm bench serve`-style load levels against an OpenAI-compatible endpoint
(ours, or any other): streamed chat completions kept `concurrency` in flight; output tok/s, TTFT, TPOT, latency."""

import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from services.cli.load import levels, percentile, work
from services.common.params import BENCH_PROMPTS
from services.serving.security import api_key


@dataclass(slots=True)
class Timed:
    latency_s: float
    ttft_s: float
    tokens: int

    @property
    def tpot_s(self) -> float:
        """Time per output token after the first (vLLM's TPOT)."""
        return (self.latency_s - self.ttft_s) / max(self.tokens - 1, 1)


@dataclass(slots=True)
class ServeRow:
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    requests_per_s: float
    ttft_mean_ms: float
    ttft_p99_ms: float
    tpot_mean_ms: float
    tpot_p99_ms: float
    latency_mean_s: float


def timed_chat(base: str, prompt: str, body: dict, headers: dict[str, str]) -> Timed:
    """One streamed chat completion, timed as its client sees it."""
    payload = {**body, "messages": [{"role": "user", "content": prompt}], "stream": True}
    payload["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(payload).encode(), headers)
    start = time.perf_counter()
    first, tokens = None, 0
    with urllib.request.urlopen(req, timeout=600) as reply:
        for line in reply:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return Timed(latency, first if first is not None else latency, tokens)


def level(base: str, concurrency: int, body: dict, headers: dict[str, str]) -> ServeRow:
    sent = work(BENCH_PROMPTS, concurrency)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        timings = list(pool.map(lambda p: timed_chat(base, p, body, headers), sent))
    wall = time.perf_counter() - start
    tokens = sum(t.tokens for t in timings)
    ttft, tpot = [t.ttft_s * 1000 for t in timings], [t.tpot_s * 1000 for t in timings]
    return ServeRow(
        concurrency,
        len(timings),
        tokens,
        wall,
        tokens / wall,
        len(timings) / wall,
        statistics.fmean(ttft),
        percentile(ttft, 0.99),
        statistics.fmean(tpot),
        percentile(tpot, 0.99),
        statistics.fmean(t.latency_s for t in timings),
    )


def table(rows: list[ServeRow]) -> str:
    head = ("conc", "reqs", "out tok", "tok/s", "req/s", "TTFT ms", "p99", "TPOT ms", "p99", "lat s")
    lines = [" ".join(f"{h:>8}" for h in head)]
    for r in rows:
        lines.append(
            f"{r.concurrency:>8} {r.requests:>8} {r.output_tokens:>8} {r.output_tokens_per_s:>8.1f} "
            f"{r.requests_per_s:>8.2f} {r.ttft_mean_ms:>8.1f} {r.ttft_p99_ms:>8.1f} {r.tpot_mean_ms:>8.2f} "
            f"{r.tpot_p99_ms:>8.2f} {r.latency_mean_s:>8.3f}"
        )
    return "\n".join(lines)


def bench_openai(args) -> int:
    base = args.target.rstrip("/").removesuffix("/v1")
    body = {"model": "dlm", "max_tokens": args.max_new_tokens, "temperature": 0.0}
    if args.strategy:
        body["strategy"] = args.strategy
    if args.set:
        from services.common.params import parse_sets

        body["dlm_params"] = parse_sets(args.set)
    headers = {"Content-Type": "application/json"}
    token = api_key(getattr(args, "api_key_file", None))  # --api-key-file, else DLM_API_KEY
    if token:
        headers["Authorization"] = f"Bearer {token}"
    timed_chat(base, BENCH_PROMPTS[0], {**body, "max_tokens": 4}, headers)  # warm up outside the timings
    rows = [level(base, c, body, headers) for c in levels(args.concurrency or "1,16")]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0
