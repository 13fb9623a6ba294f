"""What one of the C++ kernels (cpu_kernels.cpp) saves a `pipeline` decode here, against torch's ops for the same maths,
with every other kernel on in both: --kernel linear (the linears over packed panels, against F.linear on the weights as
loaded), attention (against packed_attention.attend's SDPA per segment) or logit_maths (a proposal's and a verdict's
probabilities, entropies and argmax, against proposal.TorchLogitMaths). One engine, the arms taking turns (ABBA) so
that the box's drift falls on both; each turn decodes --prompts bench prompts, --concurrency at a time. Prints each
arm's tok/s, the median of the turns' time ratios, and whether the arms decoded the same tokens.
`PYTHONPATH=. python scripts/kernel_ab.py --kernel linear [CONFIG] [--turns 12] [--prompts 16] [--concurrency 1]`

On the 2-core box (2026-11-29, 12 turns): logit_maths, torch's took 1.028-1.05x the kernel's time at c=1 (two runs),
1.044x with 16 prompts together; the same tokens."""

import argparse
import statistics
import time

from services.common.config import DEFAULT_CONFIG, EngineConfig
from services.common.cpu_kernels import CpuKernels
from services.common.lean_load import lean_model
from services.common.lean_model import LeanModel
from services.common.lean_ops import TorchOps
from services.common.params import BENCH_PROMPTS
from services.common.proposal import TorchLogitMaths
from services.orchestrator.engine.engine import Engine


class TorchLogits(CpuKernels):
    proposal_stats = staticmethod(TorchLogitMaths.proposal_stats)
    verdict_stats = staticmethod(TorchLogitMaths.verdict_stats)


class TorchAttention(CpuKernels):
    attend = staticmethod(TorchOps.attend)


class TorchLinears(CpuKernels):
    pack = staticmethod(TorchOps.pack)
    linear = staticmethod(TorchOps.linear)


def torch_arm(kernel: str, decoder: LeanModel, model) -> dict:
    """The decoder's fields with torch's ops for the kernel under test."""
    if kernel == "logit_maths":
        return {"ops": TorchLogits(decoder.ops.kernels)}
    if kernel == "attention":
        return {"ops": TorchAttention(decoder.ops.kernels)}
    loaded = lean_model(model, cpu_kernels=False)  # the weights as loaded
    return {"ops": TorchLinears(decoder.ops.kernels), "layers": loaded.layers, "head": loaded.head}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    parser.add_argument("--kernel", choices=("linear", "attention", "logit_maths"), required=True)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    engine = Engine(EngineConfig.from_yaml(args.config, strategy="pipeline", max_new_tokens=48))
    loaded = [engine.executor.load(role) for role in ("drafter", "guider")]
    if not all(isinstance(m.decoder.ops, CpuKernels) for m in loaded):
        raise SystemExit("the decoders run torch's ops here (no C++ toolchain, or cpu_kernels: false)")
    fields = ("ops", "layers", "head")
    arms = {
        "kernel": [{f: getattr(m.decoder, f) for f in fields} for m in loaded],
        "torch": [
            {f: getattr(m.decoder, f) for f in fields} | torch_arm(args.kernel, m.decoder, m.model) for m in loaded
        ],
    }
    prompts = [BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(args.prompts)]
    times: dict[str, list[float]] = {name: [] for name in arms}
    tokens: dict[str, list[list[int]]] = {}
    engine.generate(prompts[:4])  # warm
    for turn in range(args.turns):
        for name in list(arms) if turn % 2 == 0 else list(arms)[::-1]:
            for m, values in zip(loaded, arms[name], strict=True):
                for field, value in values.items():
                    object.__setattr__(m.decoder, field, value)  # LeanModel is frozen
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
