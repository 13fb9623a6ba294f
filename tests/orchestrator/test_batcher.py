import threading
import time

import pytest

from services.orchestrator.batcher import Batcher, Gang, MicroBatches


def test_calls_of_blocked_requests_collapse_into_one_send():
    sent, gang = [], Gang()
    release = threading.Event()

    def send(items):
        sent.append(list(items))
        return [x * 10 for x in items]

    batcher = Batcher(send, gang, max_wait_s=5.0)
    assert batcher("solo", 1) == 10  # alone: sent at once, no waiting
    gang.leave("solo")
    with gang.cond:
        gang.live.update(f"r{i}" for i in range(8))  # eight live requests, none blocked yet
    results = [None] * 8

    def call(i: int) -> None:
        release.wait()
        results[i] = batcher(f"r{i}", i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(5)
    assert results == [i * 10 for i in range(8)]
    assert len(sent) == 2 and sorted(sent[1]) == list(range(8))  # all eight in one send, once all were blocked


def test_a_request_that_leaves_does_not_hold_the_batch():
    gang = Gang()
    batcher = Batcher(lambda items: items, gang, max_wait_s=5.0)
    with gang.cond:
        gang.live.update({"a", "gone"})
    threading.Timer(0.05, gang.leave, args=("gone",)).start()
    assert batcher("a", 7) == 7


def test_a_failed_send_reaches_every_caller():
    def send(items):
        raise RuntimeError("replica died")

    with pytest.raises(RuntimeError, match="replica died"):
        Batcher(send, Gang())("a", 1)


def test_micro_batches_split_requests_and_send_each_gang_apart():
    sent = []

    def send(items):
        sent.append(sorted(items))
        return items

    micro = MicroBatches(2, max_wait_s=5.0)
    call = micro.batcher(send)
    assert [micro.index(f"r{i}") for i in range(4)] == [0, 1, 0, 1]  # least-populated gang first
    micro.leave("r0")
    assert micro.index("r4") == 0 and "r0" not in micro.assigned
    micro.gangs[1].live.update({"r1", "r3"})  # gang 1 live: its batch waits for both; gang 0 is not waited for
    threads = [threading.Thread(target=call, args=(f"r{i}", i)) for i in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sent == [[1, 3]]  # gang 1 sent as soon as its own members were blocked; gang 0 never held it


def test_a_gang_split_into_two_phases_rejoins():
    sent: dict[str, list] = {"draft": [], "verify": []}
    gang = Gang()
    draft = Batcher(lambda items: sent["draft"].append(sorted(items)) or items, gang, max_wait_s=5.0)
    verify = Batcher(lambda items: sent["verify"].append(sorted(items)) or items, gang, max_wait_s=5.0)
    with gang.cond:
        gang.live.update({"a", "b", "c"})

    def round_trip(rid: str) -> None:
        draft(rid, rid)
        verify(rid, rid)

    behind = [threading.Thread(target=round_trip, args=(rid,)) for rid in ("b", "c")]
    for t in behind:
        t.start()
    while len(draft.pending) < 2:
        time.sleep(0.001)
    ahead = threading.Thread(target=verify, args=("a", "a"))  # a is a stage ahead of b and c
    ahead.start()
    for t in [*behind, ahead]:
        t.join(5)
    assert sent == {"draft": [["b", "c"]], "verify": [["a", "b", "c"]]}  # a waited for them instead of going alone
