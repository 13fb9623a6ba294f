import threading

import pytest

from services.orchestrator.batcher import Batcher, Gang


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
