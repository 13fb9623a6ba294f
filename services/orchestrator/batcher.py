"""Client-side batching of remote stage calls: the calls that concurrent requests make to one deployment method
collapse into one Serve call carrying a list. Ray routes each call on one thread, so routing N calls per round costs
more than the forward they feed; one routed call per stage per round does not grow with the number of requests.

When to send: the requests decode on their own threads and drift out of phase, so a batch waits until every live
request is blocked in some remote call (no further call can arrive before one returns) or max_wait_s passes.
A request alone never waits.
"""

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Gang:
    """The live requests of an orchestrator and how many of them wait on a remote call."""

    def __init__(self):
        self.cond = threading.Condition()
        self.live: set[str] = set()
        self.blocked: Counter[str] = Counter()  # request id -> its calls in flight (overlapped stages make two)

    def all_blocked(self) -> bool:
        return len(self.blocked) >= len(self.live)

    def leave(self, request_id: str) -> None:
        with self.cond:
            self.live.discard(request_id)
            self.cond.notify_all()


class Batcher:
    def __init__(self, send: Callable[[list], list], gang: Gang, max_wait_s: float = 0.01):
        self.send, self.gang, self.max_wait_s = send, gang, max_wait_s
        self.pending: list[tuple[Any, Future]] = []
        self.leading = False

    def __call__(self, request_id: str, item: Any) -> Any:
        future: Future = Future()
        gang = self.gang
        with gang.cond:
            gang.live.add(request_id)
            gang.blocked[request_id] += 1
            self.pending.append((item, future))
            gang.cond.notify_all()
            lead = not self.leading
            self.leading = True
        try:
            if lead:
                self.flush()
            return future.result()
        finally:
            with gang.cond:
                gang.blocked[request_id] -= 1
                if not gang.blocked[request_id]:
                    del gang.blocked[request_id]

    def flush(self) -> None:
        deadline = time.monotonic() + self.max_wait_s
        with self.gang.cond:
            while not self.gang.all_blocked() and (left := deadline - time.monotonic()) > 0:
                self.gang.cond.wait(left)
            batch, self.pending, self.leading = self.pending, [], False
        try:
            results = self.send([item for item, _ in batch])
        except BaseException as e:  # every caller of the batch sees the failure
            for _, future in batch:
                future.set_exception(e)
            return
        for (_, future), result in zip(batch, results, strict=True):
            future.set_result(result)
