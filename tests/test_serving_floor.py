"""scripts/serving_floor.py, which the README cites for the least CPU a served request costs beyond its forwards: the
parts it times are real (a grpc.aio server in a process of its own, the orchestrator's writer on a redis-server), and
each is counted in the process that spends it."""

import re
import sys

import pytest

from tests.readme import ROOT, run_script

sys.path.insert(0, str(ROOT / "scripts"))
import serving_floor  # noqa: E402


def test_the_grpc_floor_counts_the_server_process_and_this_client():
    server, client = serving_floor.grpc_floor(320)  # enough for /proc's 10 ms ticks of the server's CPU
    assert 0.01 < server < 20 and 0.01 < client < 20  # ms a request: a stream each, 16 at a time


def test_it_reports_each_part_and_their_sum():
    out = run_script("scripts/serving_floor.py", "320")  # enough for /proc's 10 ms ticks of redis-server's CPU
    assert out.startswith("320 requests, 16 in flight, CPU ms a request")
    parts = dict(re.findall(r"(gRPC server|client|index client|redis-server) ([\d.]+)", out))
    assert set(parts) == {"gRPC server", "client", "index client", "redis-server"}
    assert all(float(v) > 0 for v in parts.values())
    [total] = re.findall(r"together ([\d.]+)", out)
    assert float(total) == pytest.approx(sum(map(float, parts.values())), abs=0.005)
    [way] = re.findall(r"one at a time, a stream's way in and out: ([\d.]+) ms \(median\)", out)
    assert 0 < float(way) < 20  # outside 20 ms of rounds


def test_the_way_in_and_out_leaves_out_the_handler():
    assert serving_floor.grpc_way(10) < 10  # not its 20 ms of rounds
