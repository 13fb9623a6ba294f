"""scripts/device/replica_forward.py, which the README cites for a forward on its replica against the same forward in
process: it serves the app itself and replays one round's calls on both, back to back and after an idle gap."""

import re

import pytest

from tests.readme import run_script
from tests.zoo import needs_zoo


@pytest.mark.slow
@needs_zoo
def test_it_times_each_hosts_call_in_process_and_on_its_replica_with_and_without_a_gap():
    out = run_script("scripts/device/replica_forward.py", "configs/dlm.yaml", "3", "2")
    rows = re.findall(r"^(\w+) +(in process|replica) +([\d.]+) +([\d.]+) +([\d.]+)$", out, re.M)
    assert [(host, where, float(gap)) for host, where, gap, _, _ in rows] == [
        (host, where, gap)
        for host in ("drafter", "guider")
        for gap in (0.0, 2.0)
        for where in ("in process", "replica")
    ]
    for _, _, _, compute, trip in rows:
        assert 0 < float(compute) <= float(trip)  # the round trip holds the host's compute
