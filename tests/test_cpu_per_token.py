"""scripts/cpu_per_token.py, which the README cites for where a served token's CPU goes: its in-process form runs on
the shipped zoo, and its served form's accounting (/proc) finds the CPU this process burns, under its own name."""

import os
import re
import sys
import time

import pytest

from tests.readme import ROOT, run_script
from tests.zoo import needs_zoo

sys.path.insert(0, str(ROOT / "scripts"))
import cpu_per_token  # noqa: E402


def test_the_process_accounting_names_this_process_and_counts_its_cpu():
    before = cpu_per_token.processes()
    start = time.process_time()
    while time.process_time() - start < 0.3:  # burn 0.3 s of CPU
        pass
    after = cpu_per_token.processes()
    seconds, name = after[os.getpid()]
    assert name == "this client"
    assert 0.25 <= seconds - before[os.getpid()][0] <= 1.0  # clock ticks are 10 ms


@pytest.mark.slow
@needs_zoo
def test_in_process_it_reports_tok_s_busy_cores_and_cpu_per_token():
    out = run_script("scripts/cpu_per_token.py", "--concurrency", "2", "--levels", "1")
    lines = [line for line in out.splitlines() if line.startswith("in process")]
    assert len(lines) == 1  # the warm-up level is not reported
    tok_s, cores, ms = map(float, re.findall(r"([\d.]+) (?:tok/s|busy cores|CPU ms a token)", lines[0]))
    assert tok_s > 0 and 0 < cores <= os.cpu_count() + 0.1
    assert ms == pytest.approx(1000 * cores / tok_s, rel=0.05)  # CPU per token = busy cores / tok/s
