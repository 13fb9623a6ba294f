"""Cache index: which replicas hold a request's KV, what it has committed, and how much KV each replica holds.

The orchestrator keeps one `IndexEntry` per live request: the drafter and guider replicas that hold its KV cache
(requests are routed back to them, like SGLang's cache-aware router), the committed token ids with the physical ->
logical map of reordered slots (`Request.order`), and the strategy state needed to resume on another orchestrator.
Every entry has a sliding TTL: each write refreshes it, and an entry nobody touched for `ttl_s` vanishes together
with the KV tokens it held, so a crashed orchestrator leaks nothing for long.

Per replica the index counts the KV tokens it holds. `place` is admission control against a per-replica budget in
tokens (the block manager's `can_allocate` + `allocate` in one atomic step) for one replica of each deployment at
once, all or nothing, which is how two orchestrators share one KV ledger; `release` gives back everything a request
holds.

One implementation: `RedisCacheIndex` (redis_index.py), every operation one Lua script on a redis-server; when the
config names none, `dlm serve` starts one on loopback (services/serving/redis_process.py). `make_index(url)`
(indexes.py) opens it.

The interface is async so that a remote index never blocks the event loop. Usage, per request::

    placed = await index.place(rid, [drafters, guiders], prompt_len + max_new_tokens, budget)
    if placed is None:
        ...  # queue or reject: no replica has room
    drafter, guider = placed
    await index.put(IndexEntry(rid, drafter=drafter, guider=guider, strategy="pipeline", params={...}, ttl_s=600))
    await index.commit(rid, positions=[3, 0, 1], token_ids=[17, 5, 9], snapshot=blob, streamed=4)  # every round
    await index.release(rid)  # finished or aborted

Writes that go together go in one round trip, each still atomic on its own::

    results = await index.batch([Op("commit", (rid, [4], [23], blob, 5)), Op("release", (other,))])
"""

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import NamedTuple


@dataclass(slots=True)
class IndexEntry:
    """One request's entry.

    `order` is the physical -> logical map of committed positions: logical generation positions (0 = first generated
    token, as in `Request.order`) in commit order. `token_ids` are aligned with it: `token_ids[i]` is the token at
    logical position `order[i]`, so a request resumes with `tokens[order] = token_ids`. `committed_len` is the
    committed length (`commit` adds to it; normally `len(order)`). `params` and `state` must be JSON-serialisable:
    they are stored as JSON, so `get` returns their JSON form (tuples come back as lists, int keys as strings).
    `ttl_s`: seconds without a write before the entry vanishes; None in `put` takes the index's `default_ttl_s`, and
    `get` returns the TTL in force (None: never expires).

    The record a request resumes from on another orchestrator: `snapshot` is its whole decode state (prompt ids,
    sampling parameters and RNG state, canvas, physical -> logical order, strategy state) as of its last recorded
    round, opaque here (the orchestrator pickles its `Request`); `streamed` the tokens handed to its stream by then;
    `owner` the orchestrator that decodes it, whose lease (`lease`) says it is alive.
    """

    request_id: str
    drafter: str | None = None  # replica id holding the drafter KV
    guider: str | None = None  # replica id holding the guider KV
    committed_len: int = 0
    token_ids: list[int] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    strategy: str = ""
    params: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    ttl_s: float | None = None
    owner: str | None = None
    streamed: int = 0
    snapshot: bytes = b""


class Op(NamedTuple):
    """One operation of a batch: a method of the index that writes (put, commit, place, release) and its arguments,
    positional, as that method takes them."""

    method: str
    args: tuple


class CacheIndex(ABC):
    """The interface, async (a remote index never blocks the event loop); every operation is atomic.
    Operations raise IndexUnavailable when the index cannot be reached."""

    default_ttl_s: float | None

    # ------------------------------------------------------------------ entries
    @abstractmethod
    async def put(self, entry: IndexEntry) -> None:
        """Create or replace the request's entry and (re)start its TTL. Tokens it already holds stay held."""

    @abstractmethod
    async def commit(
        self,
        request_id: str,
        positions: list[int],
        token_ids: list[int],
        snapshot: bytes | None = None,
        streamed: int | None = None,
    ) -> None:
        """Append committed positions (in commit order) and their tokens; add len(positions) to committed_len,
        replace the snapshot and the streamed count when given, and refresh the TTL, all in one step. Raises KeyError
        when the request is unknown or expired."""

    @abstractmethod
    async def adopt(self, request_id: str, owner: str) -> IndexEntry | None:
        """Make `owner` the request's owner and return its entry, unless its owner is another orchestrator whose lease
        is alive (OwnerAlive), in one step; None when the request is unknown or expired."""

    @abstractmethod
    async def orphans(self) -> list[str]:
        """The requests whose owner's lease has lapsed (or that have no owner): each is for a live orchestrator to
        `adopt`. Not a snapshot: a request may be adopted or released before it is."""

    @abstractmethod
    async def lease(self, owner: str, ttl_s: float, address: str = "") -> None:
        """Start or renew an orchestrator's lease: it is alive for ttl_s from now; address: where another
        orchestrator relays the streams of its requests from (OwnerAlive.address)."""

    @abstractmethod
    async def leases(self) -> dict[str, float]:
        """Orchestrator -> seconds its lease has left, for every live lease."""

    @abstractmethod
    async def requests(self) -> list[str]:
        """Every request that has an entry, sorted."""

    @abstractmethod
    async def get(self, request_id: str) -> IndexEntry | None:
        """The entry, or None when unknown or expired. Does not refresh the TTL."""

    @abstractmethod
    async def release(self, request_id: str) -> bool:
        """Delete the entry and give every token it holds back to its replicas. True if there was anything."""

    @abstractmethod
    async def batch(self, ops: list[Op]) -> list[object]:
        """Run the operations in order in one round trip, each as atomic as its method alone (not the batch: other
        clients' operations may come in between). Returns per operation what its method returns, or the exception it
        raises (KeyError from a commit, ValueError from bad arguments), raising none of them: a failed operation does
        not stop the ones after it. IndexUnavailable when the index cannot be reached, or restarted meanwhile: then any
        of them may or may not have happened."""

    # ------------------------------------------------------------------ replicas
    @abstractmethod
    async def place(
        self, request_id: str, candidates: list[list[str]], tokens: int, budget: int | None
    ) -> list[str] | None:
        """Atomically, for all or none of the groups of candidate replicas (one group per deployment): pick in each
        group the replica with the most room under `budget` (what the request holds already counts as room; None:
        no budget) and move every token the request holds to `tokens` on each picked replica. Returns the picked
        replica of each group, or None (nothing changed) when a group has no replica with room. `release` gives the
        tokens back; they expire with the request's entry (or after `default_ttl_s` while it has none)."""

    @abstractmethod
    async def replica_tokens(self, replica: str) -> int:
        """KV tokens the replica holds now (expired requests' tokens already given back)."""

    @abstractmethod
    async def holdings(self, replica: str) -> dict[str, int]:
        """request_id -> tokens the request holds on this replica (placed through `place`)."""

    @abstractmethod
    async def replicas(self) -> list[str]:
        """Every replica tokens were placed on, sorted, but those a release or a move left holding nothing."""

    @abstractmethod
    async def storage_keys(self) -> list[str]:
        """Every key the index stores (for tests and debugging)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


class OwnerAlive(Exception):
    """The request belongs to an orchestrator whose lease is alive: it is decoding there, not to be adopted.
    address: where that orchestrator serves its streams to others ("" when its lease names none)."""

    def __init__(self, message: str, owner: str = "", address: str = ""):
        super().__init__(message)
        self.owner, self.address = owner, address


class IndexUnavailable(Exception):
    """The index could not be reached (connection refused, timed out); the write may or may not have happened."""


def check_commit(positions: list[int], token_ids: list[int]) -> tuple[list[int], list[int]]:
    if len(positions) != len(token_ids):
        raise ValueError(f"positions ({len(positions)}) and token_ids ({len(token_ids)}) must be aligned")
    return check_ids("positions", positions), check_ids("token_ids", token_ids)


def check_ids(name: str, ids: list[int]) -> list[int]:
    ids = [int(i) for i in ids]
    if any(i < 0 or i >= 1 << 32 for i in ids):
        raise ValueError(f"{name}: values must fit in uint32")
    return ids


def json_copy(name: str, value: dict) -> dict:
    """The JSON form of value (what both backends give back); TypeError when it is not JSON-serialisable."""
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be JSON-serialisable: {e}") from None


def effective_ttl(ttl_s: float | None, default_ttl_s: float | None) -> float | None:
    ttl = default_ttl_s if ttl_s is None else ttl_s
    if ttl is not None and ttl <= 0:
        raise ValueError(f"ttl_s must be > 0 or None, got {ttl}")
    return ttl


def normalise(entry: IndexEntry, default_ttl_s: float | None) -> IndexEntry:
    """A validated copy of entry in the form get() returns."""
    if not entry.request_id:
        raise ValueError("request_id must be a non-empty string")
    if len(entry.token_ids) != len(entry.order):
        raise ValueError(f"token_ids ({len(entry.token_ids)}) and order ({len(entry.order)}) must be aligned")
    return IndexEntry(
        request_id=str(entry.request_id),
        drafter=entry.drafter or None,
        guider=entry.guider or None,
        committed_len=int(entry.committed_len),
        token_ids=check_ids("token_ids", entry.token_ids),
        order=check_ids("order", entry.order),
        strategy=str(entry.strategy or ""),
        params=json_copy("params", entry.params),
        state=json_copy("state", entry.state),
        ttl_s=effective_ttl(entry.ttl_s, default_ttl_s),
        owner=entry.owner or None,
        streamed=int(entry.streamed),
        snapshot=bytes(entry.snapshot),
    )


def copy_entry(entry: IndexEntry) -> IndexEntry:
    return IndexEntry(**{f.name: _copy(getattr(entry, f.name)) for f in fields(IndexEntry)})


def _copy(value):
    if isinstance(value, list):  # token_ids, order: ints
        return list(value)
    return json.loads(json.dumps(value)) if isinstance(value, dict) else value


def request_keys(prefix: str, request_id: str) -> list[str]:
    """A request's storage keys: entry, committed ids, order. The kind comes before the id, so no request id,
    whatever its characters, makes another request's key (`req:x:ids` is the entry of "x:ids", x's ids are
    `ids:x`)."""
    return [f"{prefix}{kind}:{request_id}" for kind in ("req", "ids", "order")]


def check_tokens(tokens: int) -> int:
    tokens = int(tokens)
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return tokens
