"""Admission against each replica's KV budget, kept in the cache index, and the index kept current round by round.

A request reserves prompt + max_new_tokens KV tokens on its drafter and guider replicas before it runs (the
scheduler keeps it waiting meanwhile). Every round appends its new commits (positions in commit order with their
tokens) to the request's index entry; the end of the request, however it ends, releases it all.
"""

from services.orchestrator.placement import Placement
from services.orchestrator.scheduler import Sequence
from services.serving.cache_index import CacheIndex, IndexEntry
from services.serving.indexes import make_index


class IndexAdmission:
    def __init__(self, index: CacheIndex, placement: Placement, ttl_s: float):
        self.index, self.placement, self.ttl_s = index, placement, ttl_s
        self.recorded: dict[str, int] = {}  # request id -> how much of its order the index holds
        self.replicas: dict[str, dict[str, str]] = {}  # request id -> the placement the index holds

    def fits(self, seq: Sequence) -> bool:
        return seq.tokens <= self.placement.budget

    def admit(self, seq: Sequence) -> bool:
        rid = seq.req.id
        chosen = self.placement.place(rid, seq.tokens)
        if chosen is None:
            return False
        done = []
        for replica in chosen.values():  # the index checks the budget across orchestrators
            if not self.index.reserve(replica, seq.tokens, self.placement.budget, request_id=rid):
                for r in done:
                    self.index.free(r, seq.tokens, request_id=rid)
                self.placement.free(rid)
                for deployment in chosen:
                    self.placement.forget(rid, deployment)
                return False
            done.append(replica)
        entry = IndexEntry(rid, chosen.get("drafter"), chosen.get("guider"), strategy=seq.strategy)
        entry.params, entry.ttl_s = {k: str(v) for k, v in seq.params.items()}, self.ttl_s
        self.index.put(entry)
        self.recorded[rid], self.replicas[rid] = 0, chosen
        return True

    def progress(self, seq: Sequence) -> None:
        req = seq.req
        new = req.order[self.recorded[req.id] :]
        if new:
            self.index.commit(req.id, new, req.tokens[new].tolist())
            self.recorded[req.id] = len(req.order)
        self.record_moves(req.id, seq.tokens)

    def record_moves(self, rid: str, tokens: int) -> None:
        """A request the hosts moved off a lost replica: the index follows it, with its reservation."""
        now = self.placement.where.get(rid, {})
        old = self.replicas[rid]
        moved = {d: r for d, r in now.items() if old.get(d) != r}
        if not moved:
            return
        for deployment, replica in moved.items():
            if deployment in old:
                self.index.free(old[deployment], tokens, request_id=rid)
            self.index.reserve(replica, tokens, None, request_id=rid)
        self.index.update(rid, **{d: r for d, r in moved.items() if d in ("drafter", "guider")})
        self.replicas[rid] = dict(now)

    def release(self, seq: Sequence) -> None:
        self.recorded.pop(seq.req.id, None)
        self.replicas.pop(seq.req.id, None)
        self.placement.free(seq.req.id)
        self.index.release(seq.req.id)


def local_admission(serving, deployments: tuple[str, ...] = ("drafter", "guider")) -> IndexAdmission:
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`): one replica each."""
    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    placement = Placement(deployments, lambda deployment: [f"local-{deployment}"], serving.kv_budget_tokens)
    return IndexAdmission(index, placement, serving.request_ttl_s)
