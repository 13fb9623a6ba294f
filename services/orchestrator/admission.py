"""Admission against each replica's KV budget, kept in the cache index, and the index kept current round by round.

A request reserves prompt + max_new_tokens KV tokens on its drafter and guider replicas before it runs (the
scheduler keeps it waiting meanwhile). Every round appends its new commits (positions in commit order with their
tokens) to the request's index entry; the end of the request, however it ends, releases it all.
"""

from services.orchestrator.scheduler import Sequence
from services.serving.cache_index import CacheIndex, IndexEntry
from services.serving.indexes import make_index


class IndexAdmission:
    def __init__(self, index: CacheIndex, replicas: dict[str, str], budget: int, ttl_s: float):
        self.index, self.replicas, self.budget, self.ttl_s = index, replicas, budget, ttl_s
        self.recorded: dict[str, int] = {}  # request id -> how much of its order the index holds

    def fits(self, seq: Sequence) -> bool:
        return seq.tokens <= self.budget

    def admit(self, seq: Sequence) -> bool:
        rid, done = seq.req.id, []
        for replica in dict.fromkeys(self.replicas.values()):
            if not self.index.reserve(replica, seq.tokens, self.budget, request_id=rid):
                for r in done:
                    self.index.free(r, seq.tokens, request_id=rid)
                return False
            done.append(replica)
        entry = IndexEntry(rid, self.replicas.get("drafter"), self.replicas.get("guider"), strategy=seq.strategy)
        entry.params, entry.ttl_s = {k: str(v) for k, v in seq.params.items()}, self.ttl_s
        self.index.put(entry)
        self.recorded[rid] = 0
        return True

    def progress(self, seq: Sequence) -> None:
        req = seq.req
        new = req.order[self.recorded[req.id] :]
        if new:
            self.index.commit(req.id, new, req.tokens[new].tolist())
            self.recorded[req.id] = len(req.order)

    def release(self, seq: Sequence) -> None:
        self.recorded.pop(seq.req.id, None)
        self.index.release(seq.req.id)


def local_admission(serving) -> IndexAdmission:
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`)."""
    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    replicas = {"drafter": "local-drafter", "guider": "local-guider"}
    return IndexAdmission(index, replicas, serving.kv_budget_tokens, serving.request_ttl_s)
