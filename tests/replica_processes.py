"""Serve replica processes by deployment, found in /proc: Ray titles them `ray::ServeReplica:<app>:<deployment>`, with
`.<method>` appended while a call runs on them."""

import os


def replica_pids(deployment: str, marker: str | None = None, app: str = "dlm") -> list[int]:
    """marker: only processes whose environment holds it (another cluster may run on the machine)."""
    title = f"ServeReplica:{app}:{deployment}"
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                name = f.read().split(b"\0")[0].decode(errors="replace")
            if not (name.endswith(title) or f"{title}." in name):
                continue
            if marker is not None:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() not in f.read():
                        continue
        except OSError:
            continue
        pids.append(int(entry))
    return pids
