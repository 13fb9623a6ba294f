"""Admission against each replica's KV budget, mirrored into the cache index round by round.

A request reserves prompt + max_new_tokens KV tokens on one replica of each KV-holding deployment before it runs (the
scheduler keeps it waiting meanwhile): the placement (placement.py) picks the live replicas with the most free budget.
The admission decides from its own copy (the placement's reservations, each live request's record) inside the
synchronous step, so a step never waits on the index; an `IndexWriter` task mirrors the copy into the index: the
record when a request is admitted, every round's new commits (positions in commit order with their tokens), the
replicas it moved to when one was lost, and the release when it ends, however it ends. While the index is down new
requests are refused (Unavailable) and running ones go on; once it is back every live record is written again.
"""

import threading
from dataclasses import dataclass

from services.common.placement import Placement
from services.orchestrator.cluster.index_writer import IndexWriter, Write
from services.orchestrator.engine.scheduler import EngineRequest, LedgerAdmission, Unavailable
from services.serving.cache_index import CacheIndex, IndexEntry, copy_entry
from services.serving.indexes import make_index


@dataclass(slots=True)
class Record:
    entry: IndexEntry  # the entry as the index should hold it: replicas, strategy, params, every commit so far
    tokens: int  # KV tokens reserved on each of its replicas
    placed: dict[str, str]  # deployment -> the replica holding its KV (the entry names the drafter and guider)

    @property
    def replicas(self) -> list[str]:
        return list(dict.fromkeys(self.placed.values()))


class IndexAdmission(LedgerAdmission):
    def __init__(self, index: CacheIndex, placement: Placement, ttl_s: float):
        super().__init__(placement)
        self.ttl_s = ttl_s
        self.records: dict[str, Record] = {}  # live (admitted) request id -> record
        self.lock = threading.Lock()  # the step may run on a worker thread, the writer on the event loop
        self.writer = IndexWriter(index, self.restore, self.lock)

    async def start(self) -> None:
        self.writer.start()

    def fits(self, er: EngineRequest) -> bool:
        if self.writer.down is not None:
            raise Unavailable(self.writer.down)
        return super().fits(er)

    def admit(self, er: EngineRequest) -> bool:
        rid = er.req.id
        with self.lock:
            placed = self.placement.place(rid, er.tokens)
            if placed is None:
                return False
            entry = IndexEntry(rid, placed.get("drafter"), placed.get("guider"), strategy=er.strategy)
            entry.params, entry.ttl_s = {k: str(v) for k, v in er.params.items()}, self.ttl_s
            record = self.records[rid] = Record(entry, er.tokens, placed)
            self.writer.push(rid, whole(record))
        return True

    def progress(self, er: EngineRequest) -> None:
        req = er.req
        with self.lock:
            record = self.records[req.id]
            self.follow(record)
            entry = record.entry
            new = req.order[len(entry.order) :]
            if not new:
                return
            ids = req.tokens[new].tolist()
            entry.order += new
            entry.token_ids += ids
            entry.committed_len += len(new)
            self.writer.push(req.id, lambda index: index.commit(req.id, new, ids))

    def follow(self, record: Record) -> None:
        """A request the hosts moved off a lost replica: the record follows it, with its reservations."""
        now = self.placement.where.get(record.entry.request_id, {})
        if now == record.placed:
            return
        record.placed = dict(now)
        record.entry.drafter, record.entry.guider = now.get("drafter"), now.get("guider")
        self.writer.push(record.entry.request_id, whole(record))

    def release(self, er: EngineRequest) -> None:
        rid = er.req.id
        with self.lock:
            super().release(er)
            if self.records.pop(rid, None) is not None:
                self.writer.push(rid, release(rid))

    def restore(self, changed: set[str]) -> list[tuple[str, Write]]:
        """Writes that bring an index that lost anything back to this copy (the writer holds the lock)."""
        ended = [(rid, release(rid)) for rid in changed if rid not in self.records]
        return ended + [(rid, whole(record)) for rid, record in self.records.items()]


def whole(record: Record) -> Write:
    """A write that replaces whatever the index holds for the request with the record: entry and reservations."""
    entry, tokens, replicas = copy_entry(record.entry), record.tokens, record.replicas

    async def write(index: CacheIndex) -> None:
        await index.release(entry.request_id)
        await index.put(entry)
        for replica in replicas:
            await index.reserve(replica, tokens, None, request_id=entry.request_id)

    return write


def release(request_id: str) -> Write:
    return lambda index: index.release(request_id)


def local_admission(placement: Placement, serving) -> IndexAdmission:
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`)."""
    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    return IndexAdmission(index, placement, serving.request_ttl_s)
