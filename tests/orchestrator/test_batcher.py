import threading

import pytest

from services.orchestrator.batcher import Batcher


def test_concurrent_calls_collapse_into_few_sends():
    sent = []

    def send(items):
        sent.append(list(items))
        return [x * 10 for x in items]

    batcher = Batcher(send, max_wait_s=0.05)
    assert batcher(1) == 10  # alone: one call, sent at once
    batcher.expected = 8
    results = [None] * 8
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher(i))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert results == [i * 10 for i in range(8)]
    assert sum(len(batch) for batch in sent) == 9 and len(sent) < 9


def test_a_failed_send_reaches_every_caller():
    def send(items):
        raise RuntimeError("replica died")

    with pytest.raises(RuntimeError, match="replica died"):
        Batcher(send)(1)
