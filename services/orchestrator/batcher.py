"""Client-side batching of remote stage calls: the calls that concurrent requests make to one deployment method
collapse into one Serve call carrying a list. Ray routes each call on one thread, so routing N calls per round costs
more than the forward they feed; one routed call per stage per round does not grow with the number of requests.

When to send: the requests decode on their own threads and drift out of phase. A batch goes when it holds every
live request of its gang, or when every one is blocked in some batch and none of the gang's sends is under way (no
call can arrive before a batch goes), or after max_wait_s. Waiting out a send in flight, instead of sending a part,
brings a gang that split into two phases back into one. A request alone never waits.

Micro-batches: the live requests are split into a few gangs, each batching on its own. While one gang's batch is
in the drafter's forward, another's is in the guider's, so the stages (replicas on their own cores or GPUs)
overlap as in pipeline parallelism instead of idling in turn.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

Call = Callable[[str, Any], Any]  # (request id, item) -> result


class Gang:
    """The live requests that batch together, how many calls each has pending or in flight, and the sends under way."""

    def __init__(self):
        self.cond = threading.Condition()
        self.live: set[str] = set()
        self.blocked: Counter[str] = Counter()  # request id -> its calls not yet returned (overlapped stages make two)
        self.sending = 0
        self.batchers: list[Batcher] = []

    def ready(self, batcher: "Batcher") -> bool:
        """Send when the batch holds the whole gang, or when all are blocked, none in a send, and no batch is larger
        (the smaller ones wait for its return, so their requests rejoin it)."""
        pending = len(batcher.pending)
        if pending >= len(self.live):
            return True
        if len(self.blocked) < len(self.live) or self.sending:
            return False
        return pending >= max(len(b.pending) for b in self.batchers)

    def unblock(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.blocked[rid] -= 1
            if not self.blocked[rid]:
                del self.blocked[rid]

    def leave(self, request_id: str) -> None:
        with self.cond:
            self.live.discard(request_id)
            self.cond.notify_all()


class Batcher:
    def __init__(self, send: Callable[[list], list], gang: Gang, max_wait_s: float = 0.01):
        self.send, self.gang, self.max_wait_s = send, gang, max_wait_s
        self.pending: list[tuple[str, Any, Future]] = []
        self.leading = False
        gang.batchers.append(self)

    def __call__(self, request_id: str, item: Any) -> Any:
        future: Future = Future()
        gang = self.gang
        with gang.cond:
            gang.live.add(request_id)
            gang.blocked[request_id] += 1
            self.pending.append((request_id, item, future))
            gang.cond.notify_all()
            lead = not self.leading
            self.leading = True
        if lead:
            self.flush()
        return future.result()

    def flush(self) -> None:
        gang, deadline = self.gang, time.monotonic() + self.max_wait_s
        with gang.cond:
            while not gang.ready(self):
                if gang.sending and len(gang.blocked) >= len(gang.live):  # the rest come back from a send: wait it out
                    gang.cond.wait()
                    deadline = time.monotonic() + self.max_wait_s  # max_wait_s bounds the wait for local work only
                elif (left := deadline - time.monotonic()) > 0:
                    gang.cond.wait(left)
                else:
                    break
            batch, self.pending, self.leading = self.pending, [], False
            gang.sending += 1
        try:
            results, error = self.send([item for _, item, _ in batch]), None
        except BaseException as e:  # every caller of the batch sees the failure
            results, error = [None] * len(batch), e
        with gang.cond:  # unblocked before a caller runs on, so no other batch counts it as blocked
            gang.sending -= 1
            gang.unblock([rid for rid, _, _ in batch])
            gang.cond.notify_all()
        for (_, _, future), result in zip(batch, results, strict=True):
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


class MicroBatches:
    """Requests assigned, for their lifetime, to the least-populated of n gangs; one Batcher per gang and method."""

    def __init__(self, n: int, max_wait_s: float):
        if n < 1:
            raise ValueError(f"micro_batches must be >= 1, got {n}")
        self.gangs, self.max_wait_s = [Gang() for _ in range(n)], max_wait_s
        self.assigned: dict[str, int] = {}
        self.lock = threading.Lock()

    def index(self, request_id: str) -> int:
        with self.lock:
            if request_id not in self.assigned:
                sizes = Counter(self.assigned.values())
                self.assigned[request_id] = min(range(len(self.gangs)), key=lambda i: sizes[i])
            return self.assigned[request_id]

    def batcher(self, send: Callable[[list], list]) -> Call:
        batchers = [Batcher(send, gang, self.max_wait_s) for gang in self.gangs]
        return lambda request_id, item: batchers[self.index(request_id)](request_id, item)

    def leave(self, request_id: str) -> None:
        with self.lock:
            i = self.assigned.pop(request_id, None)
        if i is not None:
            self.gangs[i].leave(request_id)
