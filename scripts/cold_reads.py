"""Why an op runs slower inside a step than replayed back to back here: its input has gone cold. Between two uses of
an activation, a forward streams a decoder layer's weights through the cache. Where a layer's weights exceed a core's
L2, they have pushed the activation out by its next use, and the op reads it from farther away.

This prints the L2 of CPU 0, each configured decoder's float32 weights per layer, and the median time (over --runs)
to read (sum) a tensor of each size, back to back and right after reading --evict MiB of other memory. It runs on one
torch thread: one core, one L2.
`PYTHONPATH=. python scripts/cold_reads.py [CONFIG] [--runs 200] [--evict 4]`

On the 2-core box (three runs, 2026-11-29), the L2 holds 2048 KiB and a drafter layer's weights 3.0 MiB. Reading
64 KiB took 1.8-2.1 µs back to back and 24.6-31.1 µs after 4 MiB of other reads; 256 KiB took 3.1-3.3 and 35.4-39.0 µs,
1024 KiB 9.1-13.5 and 64.5-69.0."""

import argparse
import os
import statistics
import time

import torch

from services.common.checkpoints import read_config
from services.common.config import DEFAULT_CONFIG, EngineConfig

SIZES_KIB = (64, 256, 1024)


def l2_kib() -> int | None:
    """CPU 0's level-2 cache, from sysfs; None where the kernel does not say."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    for index in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        with open(f"{root}/{index}/level") as level, open(f"{root}/{index}/size") as size:
            if level.read().strip() == "2":
                return int(size.read().strip().rstrip("K"))
    return None


def layer_mib(model_dir: str) -> float | None:
    """One decoder layer's linear weights in float32 (q, k, v, o, gate, up, down), MiB; None for a model that is not
    a decoder (the filter)."""
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        return None
    c = read_config(model_dir)
    h, i, heads = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    d = c.get("head_dim") or h // heads
    params = h * (heads + 2 * c["num_key_value_heads"]) * d + heads * d * h + 3 * h * i
    return 4 * params / 2**20


def read_us(size_kib: int, evict_mib: int, runs: int) -> float:
    """Median µs to sum a tensor of size_kib, each time right after summing evict_mib of other memory (0: none)."""
    data = torch.randn(size_kib * 256)
    other = torch.randn(evict_mib * 2**18) if evict_mib else None
    times = []
    for _ in range(runs + 10):  # the first 10 warm up
        if other is not None:
            other.sum()
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times[10:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--evict", type=int, default=4, help="MiB read between two reads of the tensor")
    args = parser.parse_args()
    torch.set_num_threads(1)
    l2 = l2_kib()
    print(f"L2 of cpu0: {l2 if l2 is not None else '?'} KiB")
    for role, path in EngineConfig.from_yaml(args.config).models.items():
        mib = layer_mib(path)
        if mib is not None:
            print(f"{role}: {mib:.1f} MiB of float32 weights a layer")
    print(f"{'read, KiB':>10} {'warm, us':>10} {f'after {args.evict} MiB, us':>18}")
    for size in SIZES_KIB:
        print(f"{size:>10} {read_us(size, 0, args.runs):>10.1f} {read_us(size, args.evict, args.runs):>18.1f}")


if __name__ == "__main__":
    main()
