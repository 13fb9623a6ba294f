"""What the fused logit maths (cpu_kernels.cpp's logit_stats: a proposal's and a verdict's probabilities, entropies and
argmax) save a `pipeline` decode here, against torch's ops for the same maths (proposal.TorchLogitMaths), with every
other kernel on in both. One engine, the two taking turns (ABBA), so that the box's drift falls on both: each turn
decodes --prompts bench prompts, one at a time (--concurrency 1) or together. Prints each arm's tok/s, the median of
the turns' time ratios, and whether the two decoded the same tokens.
`PYTHONPATH=. python scripts/logit_maths.py [CONFIG] [--turns 12] [--prompts 16] [--concurrency 1]`

On the 2-core box (2026-11-29, 12 turns): at c=1 torch's maths took 1.028-1.05x the kernel's time (two runs), 16
prompts together 1.044x; the same tokens."""

import argparse
import statistics
import time

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.cpu_kernels import CpuKernels
from services.common.params import BENCH_PROMPTS
from services.common.proposal import TorchLogitMaths
from services.orchestrator.engine.engine import Engine


class TorchMaths(CpuKernels):
    """The decoder's kernels, with torch's ops for the logit maths."""

    proposal_stats = staticmethod(TorchLogitMaths.proposal_stats)
    verdict_stats = staticmethod(TorchLogitMaths.verdict_stats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    engine = Engine(EngineConfig.from_yaml(args.config, strategy="pipeline", max_new_tokens=48))
    decoders = [engine.executor.load(role).decoder for role in ("drafter", "guider")]
    kernels = decoders[0].ops
    if not isinstance(kernels, CpuKernels):
        raise SystemExit("the decoder runs torch's ops here (no C++ toolchain, or cpu_kernels: false)")
    arms = {"kernel": kernels, "torch": TorchMaths(kernels.kernels)}
    prompts = [BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(args.prompts)]
    times: dict[str, list[float]] = {name: [] for name in arms}
    tokens: dict[str, list[list[int]]] = {}
    engine.generate(prompts[:4])  # warm
    for turn in range(args.turns):
        for name in list(arms) if turn % 2 == 0 else list(arms)[::-1]:
            for decoder in decoders:
                object.__setattr__(decoder, "ops", arms[name])  # LeanModel is frozen
            start = time.perf_counter()
            out = []
            for i in range(0, len(prompts), args.concurrency):
                out += [r.token_ids for r in engine.generate(prompts[i : i + args.concurrency])]
            times[name].append(time.perf_counter() - start)
            tokens[name] = out
    total = sum(len(ids) for ids in tokens["kernel"])
    for name in arms:
        print(f"{name}: {total * len(times[name]) / sum(times[name]):.1f} tok/s over {len(times[name])} turns")
    ratios = [t / k for t, k in zip(times["torch"], times["kernel"], strict=True)]
    print(f"torch / kernel time, median of turns: {statistics.median(ratios):.3f}")
    print(f"same tokens: {tokens['kernel'] == tokens['torch']}")


if __name__ == "__main__":
    main()
