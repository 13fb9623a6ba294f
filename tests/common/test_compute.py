import time

from services.common.compute import timed_call
from services.common.contract import Reply


class Host:
    """A call that waits off the CPU for `sleep_s`, then spins on it for `burn_s`."""

    def work(self, args: list[tuple[float, float]]) -> list[Reply]:
        sleep_s, burn_s = args[0]
        time.sleep(sleep_s)
        end = time.thread_time() + burn_s
        while time.thread_time() < end:
            pass
        return [Reply(i) for i in range(len(args))]


def test_a_call_records_its_wall_time_and_its_threads_cpu_apart():
    host = Host()
    first = timed_call(host, "drafter", "work", [(0.0, 0.01)])[0].compute
    replies = timed_call(host, "drafter", "work", [(0.08, 0.04)] * 3)
    c = replies[0].compute
    assert all(r.compute is c for r in replies)  # one record per call, shared by its replies
    assert c.host == "drafter" and c.free_since == first.end  # the thread's previous call ended then
    assert c.end - c.start >= 0.12
    assert 0.04 <= c.cpu < 0.07  # the sleep is not on a core
    assert c.cpu <= c.end - c.start
