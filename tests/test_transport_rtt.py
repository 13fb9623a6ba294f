"""scripts/transport_rtt.py, which the README cites for its no-op round trip per transport: on a Ray cluster of its
own it calls an echo through every way the orchestrator could call a replica, the rounds' channel included."""

import re

import pytest

from tests.readme import run_script

TRANSPORTS = (
    "Serve handle",
    "Ray actor call",
    "Serve replica's actor (__ray_call__)",
    "compiled graph, one actor",
    "compiled graph, 2 actors in a row",
    "gRPC unary, loopback",
    "Serve replica's channel",
)


@pytest.mark.slow
def test_it_times_a_round_trip_through_every_transport():
    out = run_script("scripts/transport_rtt.py", "5")
    rows = re.findall(r"^(.+?) +([\d.]+) +([\d.]+)$", out, re.M)
    assert [name for name, _, _ in rows] == list(TRANSPORTS)
    for _, median, p90 in rows:
        assert 0 < float(median) <= float(p90)
