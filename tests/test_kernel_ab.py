"""scripts/kernel_ab.py, which the README cites for what a C++ kernel saves a decode: both arms' tok/s over their
turns, the median time ratio, and the same tokens from both."""

import re

import pytest

from services.common import cpu_kernels
from tests.readme import run_script
from tests.zoo import needs_zoo


@needs_zoo
@pytest.mark.parametrize("kernel", ["linear", "attention", "logit_maths"])
def test_it_times_the_kernel_against_torch_s_ops_on_the_same_tokens(kernel):
    if cpu_kernels.build() is None:
        pytest.skip("no C++ toolchain here: the decoder runs torch's ops")
    out = run_script("scripts/kernel_ab.py", "--kernel", kernel, "--turns", "2", "--prompts", "4", "--concurrency", "2")
    for arm in ("kernel", "torch"):
        assert re.search(rf"^{arm}: [\d.]+ tok/s over 2 turns$", out, re.M)
    assert re.search(r"^torch / kernel time, median of turns: [\d.]+$", out, re.M)
    assert "same tokens: True" in out
