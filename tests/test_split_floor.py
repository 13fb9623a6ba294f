"""scripts/split_floor.py, which the README cites for the fastest c=1 round any split of the models over processes
reaches here: one captured round's calls on the hosts (the drafter's, then the guider's and the filter's at once), in
process and each host in a process of its own."""

import re

import pytest

from tests.readme import run_script
from tests.zoo import needs_zoo

FORMS = ["in process, 2 threads", "split, 1 thread each", "split, 2 each, passive", "split, 2 each, spinning"]
ROW = rf"^({'|'.join(FORMS)}) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$"


@pytest.mark.slow
@needs_zoo
def test_it_times_a_round_in_process_and_split_over_processes_and_bounds_served_c1():
    out = run_script("scripts/split_floor.py", "3", "2")
    rows = re.findall(ROW, out, re.M)
    assert [form for form, *_ in rows] == [*FORMS, FORMS[0]]
    assert re.search(r"^c=1 round, ms \(median of 3\) +round +drafter +guider +filter$", out, re.M)
    for _, round_ms, *computes in rows:
        assert all(0 < float(compute) < float(round_ms) for compute in computes)  # a round holds each call
    inside = max(float(r[1]) for r in rows if r[0].startswith("in process"))
    best = min(float(r[1]) for r in rows if r[0].startswith("split"))
    [line] = re.findall(
        r"^best split ([\d.]+) ms against ([\d.]+) in process: served c=1 at most ([\d.]+)x$", out, re.M
    )
    assert (float(line[0]), float(line[1])) == (best, inside)
    assert float(line[2]) == pytest.approx(inside / best, abs=0.006)
