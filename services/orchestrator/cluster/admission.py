"""Admission against each replica's KV budget in the cache index, and each request's record there, round by round.

The index is the one KV ledger of every orchestrator replica. A request reserves prompt + max_new_tokens KV tokens on
one replica of each KV-holding deployment before it runs, atomically in the index against each replica's budget (the
scheduler keeps it waiting meanwhile): a `Reserver` task (reserver.py) reserves for the queue in FIFO order, on the
live replicas the index counts freest, or on the replicas that hold an adopted request's KV, and the scheduler admits
only requests it placed. The step decides from the admission's own copy (the placement's reservations, each live
request's record), so it never waits on the index; an `IndexWriter` task writes the copy to the index: the record
when a request is placed, at every round's commit its new commits (positions in commit order with their tokens) with
a snapshot of its whole decode state and the tokens streamed, the replicas it moved to when one was lost (its
reservations move along, over the budget: the request already runs), and the release when it ends, however it ends.
While the index is down new requests, and those waiting for a reservation, are refused (Unavailable) and running
ones go on; once it is back every live record is written again.

No token is lost or repeated on a takeover, though the record is written after the round's tokens went out: a record
is the request as of the end of one round, RNG state included, and decoding from it is deterministic, so the
orchestrator that adopts it decodes the rounds since exactly as they went, and the stream sends only what follows
what the client received (api/deltas.py).

The step, the rounds' bookkeeping and the writer all run on the serving event loop, so the copy needs no lock.
"""

import pickle
from collections.abc import Callable
from dataclasses import dataclass

import services.serving.pickling  # noqa: F401 - the compact reducers of Request, which the snapshot pickles
from services.common.placement import Placement
from services.common.request import Request
from services.orchestrator.api.frontend import Adopted
from services.orchestrator.cluster.index_writer import IndexWriter, Write
from services.orchestrator.cluster.reserver import Reserver
from services.orchestrator.engine.scheduler import EngineRequest, LedgerAdmission, Unavailable
from services.serving.cache_index import CacheIndex, IndexEntry, Op, copy_entry
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
    """owner: this orchestrator's id in the index, kept alive by a lease of lease_s seconds that the writer renews."""

    def __init__(self, index: CacheIndex, placement: Placement, ttl_s: float, owner: str, lease_s: float):
        super().__init__(placement)
        self.ttl_s, self.owner = ttl_s, owner
        self.records: dict[str, Record] = {}  # placed (admitted, or about to be) request id -> record
        self.holders: dict[str, dict[str, str]] = {}  # adopted request id -> deployment -> replica its record names
        self.refusals: dict[str, Exception] = {}  # waiting request id -> why the index refused it
        self.writer = IndexWriter(index, self.restore, owner, lease_s)
        self.reserver = Reserver(index, placement, self.placed, self.refused)

    @property
    def address(self) -> str:
        return self.writer.address

    @address.setter
    def address(self, address: str) -> None:
        self.writer.address = address

    async def start(self, wake: Callable[[], None]) -> None:
        await self.writer.start()
        await super().start(wake)
        self.reserver.start()

    async def stop(self) -> None:
        await self.reserver.stop()
        await self.writer.stop()

    def fits(self, er: EngineRequest) -> bool:
        if self.writer.down is not None:
            raise Unavailable(self.writer.down)
        return super().fits(er)

    def wait(self, er: EngineRequest) -> None:
        self.reserver.add(er, self.holders.pop(er.req.id, None))

    def admit(self, er: EngineRequest) -> bool:
        return er.req.id in self.records

    def refusal(self, er: EngineRequest) -> Exception | None:
        return self.refusals.get(er.req.id)

    def refused(self, er: EngineRequest, error: Exception) -> None:
        self.refusals[er.req.id] = error
        self.wake()

    def placed(self, er: EngineRequest, chosen: dict[str, str]) -> None:
        """The reserver holds its tokens in the index: hold them here, write its record, and let the engines admit."""
        req = er.req
        self.placement.hold(req.id, chosen, er.tokens)
        entry = IndexEntry(req.id, chosen.get("drafter"), chosen.get("guider"), strategy=er.strategy)
        entry.params, entry.ttl_s, entry.owner = dict(er.params), self.ttl_s, self.owner
        entry.order, entry.token_ids = list(req.order), req.tokens[req.order].tolist()  # a resumed request has some
        entry.committed_len, entry.streamed, entry.snapshot = len(req.order), req.emitted, snapshot(req)
        record = self.records[req.id] = Record(entry, er.tokens, chosen)
        self.wake()  # before the push: the step that admits it then runs before the index writer's task
        self.writer.push(whole(record))

    def progress(self, er: EngineRequest) -> None:
        """At the round's commit: its new commits, the request's state after it, the tokens streamed by then."""
        req = er.req
        record = self.records[req.id]
        self.follow(record)
        entry = record.entry
        new = req.order[len(entry.order) :]
        ids = req.tokens[new].tolist()
        entry.order += new
        entry.token_ids += ids
        entry.committed_len += len(new)
        entry.snapshot, entry.streamed = snapshot(req), req.emitted
        self.writer.push(Write(req.id, [Op("commit", (req.id, new, ids, entry.snapshot, entry.streamed))]))

    def follow(self, record: Record) -> None:
        """A request the hosts moved off a lost replica: the record follows it, with its reservations."""
        now = self.placement.where.get(record.entry.request_id, {})
        if now == record.placed:
            return
        record.placed = dict(now)
        record.entry.drafter, record.entry.guider = now.get("drafter"), now.get("guider")
        self.writer.push(whole(record))

    def release(self, er: EngineRequest) -> None:
        rid = er.req.id
        super().release(er)
        if self.records.pop(rid, None) is not None:
            self.writer.push(self.released(rid))
        elif self.refusals.pop(rid, None) is None:
            self.reserver.withdraw(er)

    def released(self, request_id: str) -> Write:
        """Its release, after which the reserver tries again at once: the index has room now."""
        return Write(request_id, [Op("release", (request_id,))], self.reserver.room)

    async def adopt(self, request_id: str) -> Adopted:
        """Take over a request from its record: KeyError when the index has none (it ended, or expired), OwnerAlive
        while its owner's lease lives, IndexUnavailable when the index cannot be reached."""
        entry = await self.writer.index.adopt(request_id, self.owner)
        if entry is None or not entry.snapshot:
            raise KeyError(f"request {request_id!r} has no record in the cache index: it ended, or never started")
        holders = {d: replica for d, replica in (("drafter", entry.drafter), ("guider", entry.guider)) if replica}
        self.holders[request_id] = holders  # the reserver places it back on them while they live
        return Adopted(restore(entry.snapshot), entry.strategy, entry.params, holders)

    def restore(self, changed: set[str]) -> list[Write]:
        """Writes that bring an index that lost anything back to this copy."""
        ended = [self.released(rid) for rid in changed if rid not in self.records]
        return ended + [whole(record) for record in self.records.values()]


def snapshot(req: Request) -> bytes:
    """The request's whole decode state, as a Serve hop ships it (services/serving/pickling.py)."""
    return pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)


def restore(blob: bytes) -> Request:
    """A request from its snapshot. The index is as trusted as the Ray cluster, whose object store pickles too."""
    req = pickle.loads(blob)
    req.stats.restart_clock()  # its clocks were another process's
    return req


def whole(record: Record) -> Write:
    """A write that replaces whatever the index holds for the request with the record: entry and reservations, which
    move to its replicas in one step (no other orchestrator sees them free in between)."""
    entry, rid = copy_entry(record.entry), record.entry.request_id
    place = Op("place", (rid, [[replica] for replica in record.replicas], record.tokens, None))
    return Write(rid, [Op("put", (entry,)), place])


def local_admission(placement: Placement, serving, owner: str) -> IndexAdmission:
    """Admission for an orchestrator whose models run in its own process (`dlm serve --local`)."""
    index = make_index(serving.redis_url, default_ttl_s=serving.request_ttl_s)
    return IndexAdmission(index, placement, serving.request_ttl_s, owner, serving.lease_s)
