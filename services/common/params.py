"""Torch-free pieces shared by the CLI, the gRPC client and the engine: the strategy names, KEY=VALUE parsing, typed
values, the stats contract of `generate --json`, and the benchmark prompts."""

from typing import Any

# the decode strategies (services/orchestrator/decode/strategies.py: STRATEGIES), for a CLI that must not import torch
STRATEGY_NAMES = (
    "ar",
    "mdm",
    "threshold",
    "credit",
    "hierarchical",
    "guided",
    "slot",
    "streaming",
    "learn2pd",
    "pipeline",
)

# the `stats` object of `dlm generate --json`, in-process or over gRPC
STATS_KEYS = (
    "rounds",
    "drafter_forwards",
    "guider_forwards",
    "filter_calls",
    "model_forwards",
    "tokens",
    "tpf",
    "tokens_per_forward",
    "p_cache",
    "accepted_per_round",
    "ttft_s",
    "wall_s",
)


def stats_line(stats: dict) -> str:
    """`dlm generate --stats`: one line after the text."""
    rate = stats["tokens"] / stats["wall_s"] if stats["wall_s"] > 0 else 0.0
    tokens, rounds = counted(stats["tokens"], "token"), counted(stats["rounds"], "round")
    return f"{tokens}, {rounds}, TPF {stats['tpf']:.2f}, {rate:.1f} tok/s"


def counted(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# one held-out item per task family (never trained on), in the task suite's format
BENCH_PROMPTS = [
    "count from 30 step 3 for 21:",
    "copy: y w d h y p l e r f b",
    "reverse: o w s l p j i v d s a j w h m t",
    "sort: 58 68 49 27 13 91 67",
    "add 366+558=",
]


def logprob_entry(
    token_id: int, token: str, logprob: float, top: list[tuple[int, float]], top_tokens: list[str], verified: bool
) -> dict[str, Any]:
    """One token of `generate --logprobs N --json`, in process or over gRPC: its id and text, its logprob, the top
    alternatives as [id, logprob] with their texts in top_tokens, and whether the guider's distribution decided it."""
    return {
        "token_id": token_id,
        "token": token,
        "logprob": logprob,
        "top": [list(t) for t in top],
        "top_tokens": top_tokens,
        "verified": verified,
    }


def format_logprobs(entries: list[dict[str, Any]]) -> str:
    """A line per token: its text, logprob, the model whose distribution decided it, the alternatives' texts."""
    lines = [f"logprobs (sum {sum(e['logprob'] for e in entries):.4f}):"]
    for e in entries:
        top = " ".join(f"{text!r}:{lp:.3f}" for text, (_, lp) in zip(e["top_tokens"], e["top"], strict=True))
        model = "guider" if e["verified"] else "drafter"
        lines.append(f"  {e['token']!r:<10} {e['logprob']:9.4f} {model:7} {top}")
    return "\n".join(lines)


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def parse_value(kind: type, raw: Any) -> Any:
    """A KEY=VALUE string as the parameter's type; non-strings pass through."""
    if not isinstance(raw, str) or kind is str:
        return raw
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {raw!r}")
        return raw.lower() in ("true", "1")
    return kind(raw)
