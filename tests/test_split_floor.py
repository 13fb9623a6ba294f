"""scripts/split_floor.py, which the README cites for the fastest c=1 round any split of the models over processes
reaches here: one captured round's calls on the hosts, in process and each host in a process of its own."""

import re

import pytest

from tests.readme import run_script
from tests.zoo import needs_zoo

FORMS = ["in process, 2 threads", "split, 1 thread each", "split, 2 each, passive", "split, 2 each, spinning"]
ROW = rf"^({'|'.join(FORMS)}) +([\d.]+) +([\d.]+) +([\d.]+)$"


@pytest.mark.slow
@needs_zoo
def test_it_times_a_round_in_process_and_split_over_processes_and_bounds_served_c1():
    out = run_script("scripts/split_floor.py", "3", "2")
    rows = re.findall(ROW, out, re.M)
    assert [form for form, *_ in rows] == [*FORMS, FORMS[0]]
    for _, round_ms, drafter, guider in rows:
        assert 0 < float(drafter) < float(round_ms) and 0 < float(guider) < float(round_ms)  # a round holds both
    inside = max(float(r[1]) for r in rows if r[0].startswith("in process"))
    best = min(float(r[1]) for r in rows if r[0].startswith("split"))
    [line] = re.findall(
        r"^best split ([\d.]+) ms against ([\d.]+) in process: served c=1 at most ([\d.]+)x$", out, re.M
    )
    assert (float(line[0]), float(line[1])) == (best, inside)
    assert float(line[2]) == pytest.approx(inside / best, abs=0.006)
