"""Admission against each replica's KV budget, mirrored into the cache index round by round.

A request reserves prompt + max_new_tokens KV tokens on its drafter and guider replicas before it runs (the
scheduler keeps it waiting meanwhile). The admission decides from its own copy (what each replica has reserved, each
live request's record) inside the synchronous step, so a step never waits on the index; an `IndexWriter` task
mirrors the copy into the index: the record when a request is admitted, every round's new commits (positions in
commit order with their tokens), and the release when it ends, however it ends. While the index is down new requests
are refused (Unavailable) and running ones go on; once it is back every live record is written again.
"""

import threading
from dataclasses import dataclass

from services.orchestrator.index_writer import IndexWriter, Write
from services.orchestrator.scheduler import Sequence, Unavailable
from services.serving.cache_index import CacheIndex, IndexEntry, copy_entry
from services.serving.indexes import make_index

ROLES = ("drafter", "guider")  # the roles whose replicas hold a request's KV (IndexEntry's fields)


@dataclass(slots=True)
class Record:
    entry: IndexEntry  # the entry as the index should hold it: replicas, strategy, params, every commit so far
    tokens: int  # KV tokens reserved on each of its replicas

    @property
    def replicas(self) -> list[str]:
        return list(dict.fromkeys(r for r in (self.entry.drafter, self.entry.guider) if r))


class IndexAdmission:
    def __init__(self, index: CacheIndex, replicas: dict[str, str], budget: int, ttl_s: float):
        self.replicas, self.budget, self.ttl_s = replicas, budget, ttl_s
        self.records: dict[str, Record] = {}  # live (admitted) request id -> record
        self.reserved: dict[str, int] = {}  # replica -> KV tokens its live requests reserved
        self.lock = threading.Lock()  # the step may run on a worker thread, the writer on the event loop
        self.writer = IndexWriter(index, self.restore, self.lock)

    async def start(self) -> None:
        self.writer.start()

    def fits(self, seq: Sequence) -> bool:
        if self.writer.down is not None:
            raise Unavailable(self.writer.down)
        return seq.tokens <= self.budget

    def place(self, seq: Sequence) -> dict[str, str]:
        """role -> the replica a new request decodes on."""
        return dict(self.replicas)

    def admit(self, seq: Sequence) -> bool:
        rid, placed = seq.req.id, self.place(seq)
        entry = IndexEntry(rid, placed.get("drafter"), placed.get("guider"), strategy=seq.strategy)
        entry.params, entry.ttl_s = {k: str(v) for k, v in seq.params.items()}, self.ttl_s
        record = Record(entry, seq.tokens)
        with self.lock:
            if any(self.reserved.get(r, 0) + seq.tokens > self.budget for r in record.replicas):
                return False
            self.reserve(record, 1)
            self.records[rid] = record
            self.writer.push(rid, whole(record))
        return True

    def progress(self, seq: Sequence) -> None:
        req = seq.req
        with self.lock:
            entry = self.records[req.id].entry
            new = req.order[len(entry.order) :]
            if not new:
                return
            ids = req.tokens[new].tolist()
            entry.order += new
            entry.token_ids += ids
            entry.committed_len += len(new)
            self.writer.push(req.id, lambda index: index.commit(req.id, new, ids))

    def release(self, seq: Sequence) -> None:
        rid = seq.req.id
        with self.lock:
            record = self.records.pop(rid, None)
            if record is not None:
                self.reserve(record, -1)
                self.writer.push(rid, release(rid))

    def move(self, request_id: str, role: str, replica: str) -> None:
        """Record a live request's `role` (drafter or guider) on another replica: its reservation goes along."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        with self.lock:
            record = self.records[request_id]
            self.reserve(record, -1)
            setattr(record.entry, role, replica)
            self.reserve(record, 1)
            self.writer.push(request_id, whole(record))

    def reserve(self, record: Record, sign: int) -> None:
        for r in record.replicas:
            self.reserved[r] = self.reserved.get(r, 0) + sign * record.tokens

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


def local_admission(serving) -> IndexAdmission:
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`)."""
    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    replicas = {"drafter": "local-drafter", "guider": "local-guider"}
    return IndexAdmission(index, replicas, serving.kv_budget_tokens, serving.request_ttl_s)
