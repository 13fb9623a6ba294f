"""The replicas Serve routes to now, per deployment, as the request routers of this process see them
(replica_router.py). A module of its own because Serve ships a router's module by value: its globals would be
copies, and this process would never see what the routers publish."""

LIVE: dict[str, list[str]] = {}  # deployment name -> unique ids of its replicas that Serve routes to now


def live_replicas(deployment: str) -> list[str]:
    return list(LIVE.get(deployment, ()))
