"""scripts/device/profile_round.py, which the README cites for where a GPU step goes: on the CPU it profiles the
step's model calls too (they run on the calling thread), reports every step it ran, and each level's floor: its
linear and attention calls replayed alone, and the same calls timed where they ran, against the MFU reference."""

import re

import pytest

from tests.readme import run_script
from tests.zoo import needs_zoo


@pytest.mark.slow
@needs_zoo
def test_it_profiles_the_steps_model_calls_at_both_levels():
    out = run_script("scripts/device/profile_round.py", "configs/dlm.yaml")
    levels = re.findall(
        r"^== c=(\d+): (\d+) steps in [\d.]+ ms, [\d.]+ ms per step; per step: profiled CPU ops "
        r"([\d.]+) ms",
        out,
        re.M,
    )
    assert [c for c, _, _ in levels] == ["1", "16"]
    assert all(int(n) > 0 for _, n, _ in levels)
    assert "aten::mm" in out  # the forwards' matmuls: the hosts ran where the profiler looks
    floors = re.findall(
        r"^floor: the linears alone ([\d.]+) ms per step, attention ([\d.]+): ([\d.]+) of ([\d.]+) ms \(\d+%\); "
        r"model ([\d.]+) GFLOP/s, at the floor ([\d.]+)$",
        out,
        re.M,
    )
    assert len(floors) == 2
    for linears, attention, alone, step, measured, at_floor in (map(float, f) for f in floors):
        assert linears > 0 and attention > 0  # both kinds of call were recorded and replayed
        assert alone == pytest.approx(linears + attention, abs=0.02)
        assert 0 < alone < step and measured < at_floor  # the kernels alone cost less than the step they ran in
    in_place = re.findall(
        r"^in place: the linears ([\d.]+) ms per step, attention ([\d.]+): ([\d.]+) of ([\d.]+) ms \(\d+%\); model at "
        r"that ([\d.]+) GFLOP/s, (\d+)% of matmul \[\d+, 256\] x \[256, 768\] ([\d.]+) GFLOP/s \(the step: (\d+)%\)$",
        out,
        re.M,
    )
    assert len(in_place) == 2  # the drafter's MLP shape: [tokens per call, 256] x [256, 768]
    for (linears, attention, kernels, step, at_that, share, reference, mfu), floor in zip(
        (map(float, f) for f in in_place), floors, strict=True
    ):
        assert kernels == pytest.approx(linears + attention, abs=0.02) and 0 < kernels < step
        assert at_that == pytest.approx(float(floor[4]) * float(floor[3]) / kernels, rel=0.5)  # the same FLOPs
        assert share == pytest.approx(100 * at_that / reference, abs=1) and mfu < share
