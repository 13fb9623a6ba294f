"""No process the suite started outlives it: at the session's end every descendant of the pytest process (Ray's
daemons and workers, redis-server) must be gone; any left is reported, killed, and fails the run."""

import os
import signal
import time

GRACE_S = 15.0  # ray.shutdown() and redis-server's exit finish in the background


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live process below `root`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":  # a zombie has exited; its parent only has to reap it
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        todo.extend(children.get(pid, []))
    return found


def leftovers() -> dict[int, str]:
    """Wait for the suite's processes to exit; -> those still running, which are then killed."""
    deadline = time.monotonic() + GRACE_S
    while (left := descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left
