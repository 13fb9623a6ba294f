"""How often a guess of the gate's decision would hold, for overlap=true's speculation (overlap.py): `pipeline`
(follow=drafter) in process on the shipped zoo, greedy, over prompts of the five bench tasks drawn with a fixed seed.

With follow=drafter a round decides the first n of its drafts, so a speculation drafted on "the first g accepted"
holds exactly when g == n. Each guess below reads only what the drafter's proposal carries when the speculation is
sent (the guider's verdict and the filter's scores come back in that same step):
  whole window   g = all the drafts (what overlap.py speculates on);
  conf > t       the run of drafts whose drafter probability exceeds t, at least 1;
  cumprod > q    the drafts while the product of the drafter's probabilities so far exceeds q, at least 1.
Sets of 2 and 3 guesses count a round held when any of them is n (a drafter call with one speculation each), and
  guesses=k      overlap.py's guess_counts: the whole window, then the k - 1 likeliest other counts (one forward).
`PYTHONPATH=. python scripts/speculation_guesses.py [PROMPTS | bench]` (default 80 prompts; bench: BENCH_PROMPTS,
what `dlm bench` decodes; 48 new tokens each)"""

import itertools
import random
import sys

import torch

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.params import BENCH_PROMPTS
from services.common.proposal import Proposal
from services.common.sampling import SamplingParams
from services.orchestrator.decode.gate import GuiderAgreement
from services.orchestrator.decode.overlap import guess_counts
from services.orchestrator.engine.engine import Engine

LETTERS = "abcdefghijklmnopqrstuvwxyz"
GUESSES = (1, 2, 3, 4, 16)  # overlap guesses settings reported


def prompts(count: int, seed: int = 1) -> list[str]:
    """count prompts cycling through the bench's five tasks (services/common/params.py: BENCH_PROMPTS)."""
    rng = random.Random(seed)
    tasks = [
        lambda: f"count from {rng.randint(1, 60)} step {rng.randint(1, 5)} for {rng.randint(8, 24)}:",
        lambda: "copy: " + " ".join(rng.choice(LETTERS) for _ in range(rng.randint(5, 14))),
        lambda: "reverse: " + " ".join(rng.choice(LETTERS) for _ in range(rng.randint(5, 16))),
        lambda: "sort: " + " ".join(str(rng.randint(1, 99)) for _ in range(rng.randint(4, 9))),
        lambda: f"add {rng.randint(10, 999)}+{rng.randint(10, 999)}=",
    ]
    return [tasks[i % len(tasks)]() for i in range(count)]


def run_length(mask: torch.Tensor) -> int:
    return int(mask.long().cumprod(0).sum())


def guesses(probs: torch.Tensor) -> dict[str, int]:
    """probs [N], the drafter's probability of each draft -> guess name -> the accepted count it guesses."""
    out = {"whole window": len(probs)}
    for t in (0.5, 0.7, 0.9):
        out[f"conf > {t}"] = max(run_length(probs > t), 1)
    for q in (0.3, 0.5, 0.7):
        out[f"cumprod > {q}"] = max(int((probs.cumprod(0) > q).sum()), 1)
    return out


def overlap_guesses(probs: torch.Tensor) -> dict[str, list[int]]:
    """probs [N] -> overlap=true's guesses at each `guesses` setting: the counts its one speculative forward drafts."""
    return {f"guesses={k}": guess_counts(probs, k) for k in GUESSES}


def record_rounds(engine: Engine, texts: list[str]) -> list[tuple[dict[str, int | list[int]], int]]:
    """Each pipeline round's guesses and the count its gate accepted, one request at a time."""
    rounds = []
    decide = GuiderAgreement.drafter_tokens

    def recording(gate, proposal: Proposal, verdict, match, at):
        decision = decide(gate, proposal, verdict, match, at)
        rounds.append((guesses(proposal.probs) | overlap_guesses(proposal.probs), len(decision.positions)))
        return decision

    GuiderAgreement.drafter_tokens = recording
    try:
        for text in texts:
            engine.add_request(text, "pipeline", {"follow": "drafter"}, 48, SamplingParams())
            while engine.has_unfinished():
                engine.step()
    finally:
        GuiderAgreement.drafter_tokens = decide
    return rounds


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "80"
    texts = BENCH_PROMPTS if which == "bench" else prompts(int(which))
    rounds = record_rounds(Engine(EngineConfig.from_yaml(DEFAULT_CONFIG)), texts)
    names = [name for name, value in rounds[0][0].items() if isinstance(value, int)]
    sets = [name for name in rounds[0][0] if name not in names]

    def held(combo: tuple[str, ...]) -> float:
        return sum(n in {guess[name] for name in combo} for guess, n in rounds) / len(rounds)

    def held_any(name: str) -> float:
        return sum(n in guess[name] for guess, n in rounds) / len(rounds)

    print(f"{len(rounds)} rounds of {len(texts)} prompts; share of rounds where the speculation would hold:")
    for name in names:
        print(f"  {name:16s} {held((name,)):.2f}")
    for size in (2, 3):
        combo = max(itertools.combinations(names, size), key=held)
        print(f"  best {size}: {' | '.join(combo)}  {held(combo):.2f}")
    for name in sets:
        print(f"  {name:16s} {held_any(name):.2f}")


if __name__ == "__main__":
    main()
