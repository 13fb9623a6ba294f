"""Detokenization cost per round at 1024 output tokens: TextStream (DecodeStream, the new ids only) against
decoding the whole output every round (what the server did before).
`PYTHONPATH=. python scripts/detok_cost.py [TOKENIZER_DIR]`"""

import sys
import time

from transformers import AutoTokenizer

from services.orchestrator.api.detok import TextStream, detokenizer

TOKENS, PER_ROUND, REPEATS = 1024, 4, 5
TEXT = "count from 1 to 9: 1 2 3 4 5 6 7 8 9. déjà vu € 😀 中文; def add(a, b): return a + b\n"


def per_round_us(run) -> tuple[float, float]:
    """(mean over the rounds, mean over the last 16 rounds) in microseconds, best of REPEATS."""
    best = None
    for _ in range(REPEATS):
        times = run()
        if best is None or sum(times) < sum(best):
            best = times
    return 1e6 * sum(best) / len(best), 1e6 * sum(best[-16:]) / 16


def rounds(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + PER_ROUND] for i in range(0, len(ids), PER_ROUND)]


def redecode(tok, ids: list[int]) -> list[float]:
    times, prefix = [], []
    for r in rounds(ids):
        start = time.perf_counter()
        prefix += r
        tok.decode(prefix, skip_special_tokens=True)
        times.append(time.perf_counter() - start)
    return times


def stream(tok, ids: list[int]) -> list[float]:
    times, text = [], TextStream(detokenizer(tok), ["</s>"])
    for r in rounds(ids):
        start = time.perf_counter()
        text.push(r)
        times.append(time.perf_counter() - start)
    assert text.text + text.flush()[0] == tok.decode(ids, skip_special_tokens=True)
    return times


def main(path: str = "models/tokenizer") -> None:
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok.encode(TEXT * 200, add_special_tokens=False)[:TOKENS]
    print(f"{TOKENS} output tokens, {PER_ROUND} per round ({len(rounds(ids))} rounds), {path}")
    for name, run in (("full decode per round", redecode), ("TextStream (DecodeStream)", stream)):
        mean, last = per_round_us(lambda run=run: run(tok, ids))
        print(f"{name:<28} {mean:8.1f} us/round mean   {last:8.1f} us/round at ~{TOKENS} tokens")


if __name__ == "__main__":
    main(*sys.argv[1:])
