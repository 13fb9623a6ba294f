"""Client-side batching of remote stage calls: the calls that concurrent requests make to one deployment method
collapse into one Serve call carrying a list. Ray routes each call on one thread, so routing N calls per round costs
more than the forward they feed; one routed call per round does not grow with the number of requests.

Leader/follower: the first caller of a cycle waits until as many calls as the last batch had have joined (or
max_wait_s passed), then sends them all; the others wait for their share. One request alone never waits.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Batcher:
    def __init__(self, send: Callable[[list], list], max_wait_s: float = 0.002):
        self.send, self.max_wait_s = send, max_wait_s
        self.lock = threading.Condition()
        self.pending: list[tuple[Any, Future]] = []
        self.leading = False
        self.expected = 1  # size of the last batch: how many calls a round of the live requests makes

    def __call__(self, item: Any) -> Any:
        future: Future = Future()
        with self.lock:
            self.pending.append((item, future))
            self.lock.notify_all()
            lead = not self.leading
            self.leading = self.leading or lead
        if lead:
            self.flush()
        return future.result()

    def flush(self) -> None:
        deadline = time.monotonic() + self.max_wait_s
        with self.lock:
            while len(self.pending) < self.expected and (left := deadline - time.monotonic()) > 0:
                self.lock.wait(left)
            batch, self.pending, self.leading = self.pending, [], False
            self.expected = len(batch)
        try:
            results = self.send([item for item, _ in batch])
        except BaseException as e:  # every caller of the batch sees the failure
            for _, future in batch:
                future.set_exception(e)
            return
        for (_, future), result in zip(batch, results, strict=True):
            future.set_result(result)
