"""The lean decoder's fused CPU kernels (cpu_kernels.cpp): its ops (lean_ops.Ops) for float32 on the CPU, where each
torch op is a pass over a cold activation and the norms alone are eight ops each; and the proposals' and verdicts'
maths over its logits (proposal.LogitMaths), one kernel for what torch does in about ten ops. Built with torch's C++
extension toolchain on first use, for the instruction set torch itself dispatches to on this CPU, and cached
(TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions). `python -m services.common.cpu_kernels` builds them ahead
(make setup). Without a C++ compiler, or with engine.cpu_kernels false, the decoder runs torch's ops.
"""

import functools
import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor

from services.common.kv import layer_kv
from services.common.lean_ops import TORCH_OPS, Ops
from services.common.packed_attention import Segment, keep

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(__file__), "cpu_kernels.cpp")
# torch's own CPU capability -> the flags that let ATen's vector types (at::vec) use it (and -fopenmp for the kernels'
# loops, which run on the OpenMP runtime torch loaded)
ARCH_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}


@functools.cache
def build() -> ModuleType | None:
    """The compiled kernels, or None (logged) where they cannot be built here."""
    import ninja  # the build tool torch's loader runs: pip's, where the system has none on PATH
    from torch.utils import cpp_extension  # imports setuptools: only where the kernels are wanted

    if shutil.which("ninja") is None:
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")

    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ARCH_FLAGS:
        capability = "DEFAULT"  # ATen's portable vectors
    flags = ["-O3", "-fopenmp", *ARCH_FLAGS.get(capability, [])]
    flags += [f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"]
    try:
        return cpp_extension.load(f"dlm_cpu_kernels_{capability.lower()}_{checkout()}", [SOURCE], extra_cflags=flags)
    except (OSError, RuntimeError, ImportError) as e:  # no compiler or ninja, a read-only cache
        log.warning("the fused CPU kernels could not be built (%s); the lean decoder runs torch's ops", e)
        return None


def checkout() -> str:
    """A tag of this source's path: two checkouts sharing one cache each build their own (torch rebuilds a name whose
    source path changed, under any process that has it loaded)."""
    return hashlib.sha1(SOURCE.encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class Panels:
    """A linear's weight [n, K] as the kernels' linear reads it: a copy in panels of W^T (cpu_kernels.cpp pack_linear),
    each streamed in once a call and kept in L2 while every row runs over it."""

    data: Tensor  # [n * K]
    n: int

    def numel(self) -> int:
        return self.data.numel()


class CpuKernels:
    """lean_ops.Ops on the compiled kernels: float32 CPU tensors only (ops_for)."""

    def __init__(self, kernels: ModuleType):
        self.kernels = kernels

    def pack(self, weight: Tensor) -> Panels | Tensor:
        """Panels where the kernel takes the weight (its rows a multiple of the vector width), else the weight."""
        if weight.shape[0] % self.kernels.lanes:
            return weight
        return Panels(self.kernels.pack_linear(weight), weight.shape[0])

    def linear(self, x: Tensor, weight: Panels | Tensor, bias: Tensor | None = None) -> Tensor:
        if isinstance(weight, Panels):
            return self.kernels.linear(x, weight.data, weight.n, bias)
        return F.linear(x, weight, bias)

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return self.kernels.rms_norm(x, weight, eps)

    def qk_norm_rotary(self, qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
        return self.kernels.qk_norm_rotary(qk, weight, cos, sin, eps)

    def swiglu(self, gate_up: Tensor) -> Tensor:
        return self.kernels.swiglu(gate_up)

    def attend(
        self, query: Tensor, key: Tensor, value: Tensor, segments: list[Segment], layer: int, scale: float
    ) -> Tensor:
        pasts = [layer_kv(seg.cache, layer) or (None, None) for seg in segments]
        out, keys, values = self.kernels.attend(
            query,
            key,
            value,
            [seg.new.start for seg in segments],
            [seg.new.stop for seg in segments],
            [past[0] for past in pasts],
            [past[1] for past in pasts],
            [seg.mask for seg in segments],
            [seg.causal for seg in segments],
            scale,
        )
        for seg, k, v in zip(segments, keys, values, strict=True):
            keep(seg, layer, k, v)
        return out

    def proposal_stats(self, logits: Tensor, ids: Tensor | None, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        first, first_prob, picked, entropy = self.kernels.logit_stats(logits, mask_id, ids)
        return (first, first_prob, entropy) if ids is None else (ids, picked, entropy)

    def verdict_stats(self, logits: Tensor, draft: Tensor, mask_id: int) -> tuple[Tensor, Tensor, Tensor]:
        first, first_prob, drafted, _ = self.kernels.logit_stats(logits, mask_id, draft)
        return first, first_prob, drafted


def ops_for(device: torch.device, dtype: torch.dtype, fused: bool = True) -> Ops:
    """The kernels for float32 on the CPU where they build (and fused is on); torch's ops otherwise."""
    if fused and device.type == "cpu" and dtype == torch.float32 and (kernels := build()) is not None:
        return CpuKernels(kernels)
    return TORCH_OPS


if __name__ == "__main__":
    module = build()
    print(f"fused CPU kernels: {module.__file__ if module else 'not built (see the warning above)'}")
