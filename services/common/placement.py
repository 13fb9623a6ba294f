"""Where each request's KV lives: one replica of every deployment that holds KV (drafter, guider, ar). A request is
placed when it is admitted, on the live replica with the most free KV budget, and stays there until that replica goes
(it died, timed out, or Serve scaled it down); it then moves to the live replica with the most free budget, which
rebuilds its KV from the request (services/serving/replica_router.py).

In process it is the KV ledger: each executor has one (services/common/contract.py), the engine's scheduler admits a
request only where it reserves room in it, and the replicas keep no budget of their own; each host has one replica,
"local". Served, the ledger is the cache index, which every orchestrator shares: the admission reserves there and
holds here what the index chose (services/orchestrator/cluster/admission.py), and the remote executor routes each call
by it."""

from collections import Counter
from collections.abc import Callable, Iterable


class Placement:
    def __init__(self, deployments: Iterable[str], live: Callable[[str], list[str]], budget_tokens: int):
        self.deployments = tuple(deployments)
        self.live, self.budget = live, budget_tokens
        self.where: dict[str, dict[str, str]] = {}  # request id -> deployment -> replica holding its KV
        self.tokens: dict[str, int] = {}  # request id -> KV tokens it reserves on each of its replicas
        self.used: Counter[str] = Counter()  # replica -> KV tokens reserved on it

    def place(self, request_id: str, tokens: int) -> dict[str, str] | None:
        """Reserve `tokens` on the freest live replica of each deployment; None: no live replica has room now."""
        chosen = {}
        for deployment in self.deployments:
            replica = self.freest(deployment)
            if replica is None or self.used[replica] + tokens > self.budget:
                return None
            chosen[deployment] = replica
        self.hold(request_id, chosen, tokens)
        return dict(chosen)

    def hold(self, request_id: str, chosen: dict[str, str], tokens: int) -> None:
        """Record a placement decided here (place) or in the cache index, which several orchestrators share. A
        replica that runs several of its deployments' hosts (serving.colocate) reserves its tokens once, as the
        index counts them."""
        for replica in set(chosen.values()):
            self.used[replica] += tokens
        self.where[request_id], self.tokens[request_id] = dict(chosen), tokens

    def replica(self, request_id: str, deployment: str) -> str | None:
        return self.where.get(request_id, {}).get(deployment)

    def move(self, request_id: str, deployment: str, gone: set[str]) -> str | None:
        """Re-place a request (or place one no admission placed) on the freest live replica not in `gone`, even over
        its budget (the request is already running); None while no live replica exists (Serve is restarting one)."""
        replica = self.freest(deployment, gone)
        if replica is None:
            return None
        held, tokens = self.where.setdefault(request_id, {}), self.tokens.setdefault(request_id, 0)
        before = set(held.values())
        held[deployment] = replica
        for gone_from in before - set(held.values()):
            self.used[gone_from] -= tokens
        for moved_to in set(held.values()) - before:
            self.used[moved_to] += tokens
        return replica

    def free(self, request_id: str) -> None:
        """Give back its budget; routing keeps its replicas until its KV is released there (drop)."""
        for replica in set(self.where.get(request_id, {}).values()):
            self.used[replica] -= self.tokens[request_id]
        self.tokens[request_id] = 0

    def drop(self, request_id: str) -> None:
        """After its KV was released everywhere: forget where it was."""
        self.where.pop(request_id, None)
        self.tokens.pop(request_id, None)

    def freest(self, deployment: str, gone: set[str] = frozenset()) -> str | None:
        live = [r for r in self.live(deployment) if r not in gone]
        return min(live, key=lambda r: (self.used[r], r), default=None)
