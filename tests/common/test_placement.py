"""Placement: new requests on the live replica with the most free KV budget; a request whose replica is gone moves
to the freest live one (tests/orchestrator/cluster/test_admission.py: the cache index follows it)."""

from services.common.placement import Placement


def test_new_requests_go_to_the_freest_live_replica_until_none_has_room():
    live = {"drafter": ["d0", "d1"], "guider": ["g0"]}
    placement = Placement(("drafter", "guider"), live.__getitem__, budget_tokens=100)
    assert placement.place("a", 40) == {"drafter": "d0", "guider": "g0"}
    assert placement.place("b", 30) == {"drafter": "d1", "guider": "g0"}
    assert placement.place("c", 20) == {"drafter": "d1", "guider": "g0"}  # d1 holds 30, d0 40
    assert placement.place("d", 20) is None  # g0 holds 90 of 100
    placement.free("a")
    assert placement.place("d", 20) == {"drafter": "d0", "guider": "g0"}


def test_a_request_moves_off_a_lost_replica_and_waits_while_none_is_live():
    live = {"drafter": ["d0", "d1"]}
    placement = Placement(("drafter",), lambda d: live[d], budget_tokens=100)
    placement.place("a", 10), placement.place("b", 60)
    assert placement.move("b", "drafter", gone={"d1"}) == "d0"
    assert placement.used["d0"] == 70 and placement.used["d1"] == 0
    live["drafter"] = []  # Serve restarts the only replica
    assert placement.move("a", "drafter", gone={"d0"}) is None and placement.replica("a", "drafter") == "d0"
    live["drafter"] = ["d2"]
    assert placement.move("a", "drafter", gone={"d0"}) == "d2"


def test_a_replica_running_several_of_a_requests_hosts_reserves_its_tokens_once():
    """Colocated (serving.colocate): the drafter's and the guider's KV of a request on one replica, as the cache
    index counts it; a move of one host's KV off it keeps the reservation until no host of the request is left."""
    live = {"drafter": ["m0", "m1"], "guider": ["m0", "m1"]}
    placement = Placement(("drafter", "guider"), live.__getitem__, budget_tokens=100)
    assert placement.place("a", 60) == {"drafter": "m0", "guider": "m0"}
    assert placement.used == {"m0": 60}
    assert placement.place("b", 60) == {"drafter": "m1", "guider": "m1"}
    assert placement.move("a", "drafter", gone={"m0"}) == "m1"
    assert placement.used == {"m0": 60, "m1": 120}
    assert placement.move("a", "guider", gone={"m0"}) == "m1"
    assert placement.used == {"m0": 0, "m1": 120}
    placement.free("a")
    assert placement.used == {"m0": 0, "m1": 60}
