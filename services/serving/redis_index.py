"""The cache index on Redis (>= 6.2): every operation is one Lua script, so each is atomic across orchestrators; a
batch is one pipeline of them (one round trip).

Keys (prefix `dlm:` by default):

    {p}req:{id}               hash: drafter, guider, committed_len, strategy, params (JSON), state (JSON), ttl_ms
    {p}ids:{id}               string: committed token ids, little-endian uint32, commit order (APPEND per round)
    {p}order:{id}             string: logical positions, little-endian uint32, commit order (physical -> logical)
    {p}replica:{r}:tokens     int: KV tokens the replica holds
    {p}replica:{r}:held       hash: request id -> tokens it holds on the replica
    {p}replica:{r}:exp        zset: request id -> expiry (ms since the epoch, server clock; +inf: never)
    {p}replicas               set: every replica that tokens were placed on
    {p}lease:{owner}          string: an orchestrator's relay address, alive while the key lives (PX = its lease)

The three request keys share one TTL (PEXPIRE, refreshed by every write). Redis cannot run code when a key expires,
so a replica's tokens are given back lazily: every script that touches a replica first sweeps the requests whose
expiry has passed out of its `held`/`exp` and subtracts their tokens from its counter. Scripts build replica keys
from the `replicas` set, which a single Redis instance allows and Redis Cluster does not (use one instance, as the
Kubernetes manifests do).
"""

import json
import struct
from collections.abc import Callable, Iterable
from functools import partial
from typing import NamedTuple

import redis.asyncio as redis
from redis import exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.serving.cache_index import (
    CacheIndex,
    IndexEntry,
    IndexUnavailable,
    Op,
    OwnerAlive,
    check_commit,
    check_tokens,
    effective_ttl,
    normalise,
    request_keys,
)

__all__ = ["RedisCacheIndex", "pack_ids", "unpack_ids"]

UNREACHABLE = (exceptions.ConnectionError, exceptions.TimeoutError)  # raised as IndexUnavailable
NO_SCRIPT = exceptions.NoScriptError  # a batch's reply when Redis lost a script (a restart, SCRIPT FLUSH)
ORPHAN_BATCH = 500  # entries one `orphans` script checks, so that no script holds Redis for long

_LIB = """
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fmt(x) return string.format('%d', x) end
local function rkey(r, s) return P .. 'replica:' .. r .. ':' .. s end
local function sweep(r, now)
  local exp = rkey(r, 'exp')
  local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', '(' .. fmt(now))
  if #dead == 0 then return end
  local held = rkey(r, 'held')
  local freed = 0
  for _, rid in ipairs(dead) do
    freed = freed + (tonumber(redis.call('HGET', held, rid)) or 0)
    redis.call('HDEL', held, rid)
    redis.call('ZREM', exp, rid)
  end
  if freed ~= 0 then redis.call('DECRBY', rkey(r, 'tokens'), freed) end
end
-- a replica that holds nothing leaves the index (no key stays behind its last request)
local function drop_if_idle(r)
  if tonumber(redis.call('GET', rkey(r, 'tokens')) or '0') <= 0 and redis.call('HLEN', rkey(r, 'held')) == 0 then
    redis.call('DEL', rkey(r, 'tokens'), rkey(r, 'held'), rkey(r, 'exp'))
    redis.call('SREM', P .. 'replicas', r)
  end
end
-- give back every token a request holds; -> on how many replicas it held some
local function unhold(rid, now)
  local found = 0
  for _, r in ipairs(redis.call('SMEMBERS', P .. 'replicas')) do
    sweep(r, now)
    local h = redis.call('HGET', rkey(r, 'held'), rid)
    if h then
      redis.call('DECRBY', rkey(r, 'tokens'), h)
      redis.call('HDEL', rkey(r, 'held'), rid)
      redis.call('ZREM', rkey(r, 'exp'), rid)
      found = found + 1
      drop_if_idle(r)
    end
  end
  return found
end
-- when tokens charged to a request expire: with its entry, or after default_ms ('' = never) while it has none
local function expiry(rid, now, default_ms)
  local pttl = redis.call('PTTL', P .. 'req:' .. rid)
  if pttl >= 0 then return fmt(now + pttl) end
  if pttl == -2 and default_ms ~= '' then return fmt(now + tonumber(default_ms)) end
  return '+inf'
end
-- apply the entry's TTL to its three keys and move its holdings' expiry to the entry's
local function touch(rid, now)
  local ttl = redis.call('HGET', KEYS[1], 'ttl_ms')
  local score = '+inf'
  for i = 1, 3 do
    if ttl and ttl ~= '' then redis.call('PEXPIRE', KEYS[i], ttl) else redis.call('PERSIST', KEYS[i]) end
  end
  if ttl and ttl ~= '' then score = fmt(now + tonumber(ttl)) end
  for _, r in ipairs(redis.call('SMEMBERS', P .. 'replicas')) do
    sweep(r, now)
    if redis.call('ZSCORE', rkey(r, 'exp'), rid) then redis.call('ZADD', rkey(r, 'exp'), score, rid) end
  end
end
local function snapshot()
  if redis.call('EXISTS', KEYS[1]) == 0 then return false end
  return {redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[2]) or '', redis.call('GET', KEYS[3]) or ''}
end
"""

# ARGV: P, id, ttl_ms, drafter, guider, committed_len, strategy, params, state, ids, order, owner, streamed, snapshot
_PUT = """
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'drafter', ARGV[4], 'guider', ARGV[5], 'committed_len', ARGV[6],
           'strategy', ARGV[7], 'params', ARGV[8], 'state', ARGV[9], 'ttl_ms', ARGV[3],
           'owner', ARGV[12], 'streamed', ARGV[13], 'snapshot', ARGV[14])
redis.call('SET', KEYS[2], ARGV[10])
redis.call('SET', KEYS[3], ARGV[11])
touch(ARGV[2], now_ms())
return 1
"""

# ARGV: P, id, n, ids, order[, snapshot, streamed]
_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('APPEND', KEYS[2], ARGV[4])
redis.call('APPEND', KEYS[3], ARGV[5])
redis.call('HINCRBY', KEYS[1], 'committed_len', ARGV[3])
if #ARGV >= 7 then redis.call('HSET', KEYS[1], 'snapshot', ARGV[6], 'streamed', ARGV[7]) end
touch(ARGV[2], now_ms())
return 1
"""

_GET = """
return snapshot()
"""

# ARGV: P, id, owner; {owner, its lease's address} while another owner's lease is alive
_ADOPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local old = redis.call('HGET', KEYS[1], 'owner') or ''
local alive = old ~= '' and old ~= ARGV[3] and redis.call('GET', P .. 'lease:' .. old)
if alive then return {old, alive} end
redis.call('HSET', KEYS[1], 'owner', ARGV[3])
touch(ARGV[2], now_ms())
return snapshot()
"""

# KEYS: entries (req:{id}); ARGV: P -- the entries whose owner holds no lease
_ORPHANS = """
local out = {}
for _, key in ipairs(KEYS) do
  local owner = redis.call('HGET', key, 'owner')
  if owner and (owner == '' or redis.call('EXISTS', P .. 'lease:' .. owner) == 0) then out[#out + 1] = key end
end
return out
"""

# ARGV: P, id
_RELEASE = """
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3]) + unhold(ARGV[2], now_ms())
"""

# ARGV: P, id, tokens, budget ('' = none), default_ttl_ms ('' = never), then per deployment: n, its n candidates.
# Picks per deployment the candidate with the most room (the request's own holdings count as room), all or nothing,
# then moves every token the request holds to the chosen replicas. Returns them, or false when one has no room.
_PLACE = """
local rid, n, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local chosen, at = {}, 6
while at <= #ARGV do
  local best, least = nil, nil
  for j = at + 1, at + tonumber(ARGV[at]) do
    local r = ARGV[j]
    sweep(r, now)
    local used = tonumber(redis.call('GET', rkey(r, 'tokens')) or '0')
    used = used - tonumber(redis.call('HGET', rkey(r, 'held'), rid) or '0')
    if (not budget or used + n <= budget) and (not best or used < least or (used == least and r < best)) then
      best, least = r, used
    end
  end
  if not best then return false end
  chosen[#chosen + 1] = best
  at = at + tonumber(ARGV[at]) + 1
end
unhold(rid, now)
local score = expiry(rid, now, ARGV[5])
local held = {}
for _, r in ipairs(chosen) do
  if not held[r] then
    held[r] = true
    redis.call('SADD', P .. 'replicas', r)
    redis.call('INCRBY', rkey(r, 'tokens'), n)
    redis.call('HSET', rkey(r, 'held'), rid, n)
    redis.call('ZADD', rkey(r, 'exp'), score, rid)
  end
end
return chosen
"""

# ARGV: P, replica
_REPLICA_TOKENS = """
sweep(ARGV[2], now_ms())
return tonumber(redis.call('GET', rkey(ARGV[2], 'tokens')) or '0')
"""

_HOLDINGS = """
sweep(ARGV[2], now_ms())
return redis.call('HGETALL', rkey(ARGV[2], 'held'))
"""

# ARGV: P -- sweep every replica (storage_keys); returns nothing
_SWEEP_ALL = """
local now = now_ms()
for _, r in ipairs(redis.call('SMEMBERS', P .. 'replicas')) do sweep(r, now) end
return 1
"""


def pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def unpack_ids(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 4}I", blob))


def _ttl_ms(ttl_s: float | None) -> str:
    return "" if ttl_s is None else str(max(1, round(ttl_s * 1000)))


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


class _Call(NamedTuple):
    """One script call, made alone (`_call`) or in a batch: its script, keys and arguments after the prefix, and what
    makes its reply the method's result."""

    script: str
    keys: list[str]
    args: tuple
    result: Callable[[object], object]


def _prepared(prepare: Callable[..., _Call] | None, op: Op) -> _Call | Exception:
    """op's call, or what is wrong with it, which the batch returns in its place."""
    if prepare is None:
        return ValueError(f"{op.method!r} is not an operation a batch runs (put, commit, place, release)")
    try:
        return prepare(*op.args)
    except Exception as e:
        return e


def _result(call: _Call, reply: object) -> object:
    if isinstance(reply, Exception):  # a script's error
        return reply
    try:
        return call.result(reply)
    except KeyError as e:
        return e


def _nothing(reply: object) -> None:
    return None


def _committed(request_id: str, ok: object) -> None:
    if not ok:
        raise KeyError(request_id)


def _chosen(chosen: list[bytes] | None) -> list[str] | None:
    return [r.decode() for r in chosen] if chosen else None


class RedisCacheIndex(CacheIndex):
    def __init__(self, client: redis.Redis, prefix: str = "dlm:", default_ttl_s: float | None = 3600.0):
        self.client = client
        self.prefix = prefix
        self.default_ttl_s = effective_ttl(None, default_ttl_s)
        scripts = {
            "put": _PUT,
            "commit": _COMMIT,
            "get": _GET,
            "adopt": _ADOPT,
            "orphans": _ORPHANS,
            "release": _RELEASE,
            "place": _PLACE,
            "replica_tokens": _REPLICA_TOKENS,
            "holdings": _HOLDINGS,
            "sweep_all": _SWEEP_ALL,
        }
        self._scripts = {name: client.register_script(_LIB + src) for name, src in scripts.items()}
        self._loaded = False  # whether Redis holds the scripts a batch runs, as far as this client knows

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "dlm:", default_ttl_s: float | None = 3600.0, **redis_kwargs):
        """redis://[:password@]host:port/db, rediss://... (TLS) or unix:///path.sock; extra kwargs go to redis-py.
        A call fails within about a second while Redis is down (IndexUnavailable); it is retried once on a fresh
        connection, so the first call after Redis restarted goes through."""
        redis_kwargs.setdefault("health_check_interval", 30)
        redis_kwargs.setdefault("socket_connect_timeout", 1.0)
        redis_kwargs.setdefault("socket_timeout", 1.0)
        redis_kwargs.setdefault("retry", Retry(NoBackoff(), 1))
        return cls(redis.Redis.from_url(url, **redis_kwargs), prefix=prefix, default_ttl_s=default_ttl_s)

    def __str__(self) -> str:
        kw = self.client.connection_pool.connection_kwargs  # no password: this names the index in error messages
        where = kw.get("path") or f"{kw.get('host')}:{kw.get('port')}"
        return f"Redis at {where}"

    def unreachable(self, error: Exception) -> IndexUnavailable:
        return IndexUnavailable(f"cache index ({self}) unavailable: {error}")

    async def close(self) -> None:
        await self.client.aclose()

    # ------------------------------------------------------------------ internals
    def _req_keys(self, request_id: str) -> list[str]:
        return request_keys(self.prefix, request_id)

    async def _run(self, name: str, keys: list[str], *args):
        try:
            return await self._scripts[name](keys=keys, args=[self.prefix, *args])
        except UNREACHABLE as e:
            raise self.unreachable(e) from e

    async def _call(self, call: _Call):
        return call.result(await self._run(call.script, call.keys, *call.args))

    def _decode(self, request_id: str, snap) -> IndexEntry | None:
        if not snap:
            return None
        flat, ids, order = snap
        h = {flat[i].decode(): flat[i + 1] for i in range(0, len(flat), 2)}
        ttl = h.get("ttl_ms", b"").decode()
        return IndexEntry(
            request_id=request_id,
            drafter=h["drafter"].decode() or None,
            guider=h["guider"].decode() or None,
            committed_len=int(h["committed_len"]),
            token_ids=unpack_ids(ids),
            order=unpack_ids(order),
            strategy=h["strategy"].decode(),
            params=json_loads(h["params"]),
            state=json_loads(h["state"]),
            ttl_s=int(ttl) / 1000 if ttl else None,
            owner=h.get("owner", b"").decode() or None,
            streamed=int(h.get("streamed", 0)),
            snapshot=h.get("snapshot", b""),
        )

    # ------------------------------------------------------------------ entries
    async def put(self, entry: IndexEntry) -> None:
        await self._call(self._put(entry))

    def _put(self, entry: IndexEntry) -> _Call:
        e = normalise(entry, self.default_ttl_s)
        args = (
            e.request_id,
            _ttl_ms(e.ttl_s),
            e.drafter or "",
            e.guider or "",
            e.committed_len,
            e.strategy,
            json_dumps(e.params),
            json_dumps(e.state),
            pack_ids(e.token_ids),
            pack_ids(e.order),
            e.owner or "",
            e.streamed,
            e.snapshot,
        )
        return _Call("put", self._req_keys(e.request_id), args, _nothing)

    async def commit(
        self,
        request_id: str,
        positions: list[int],
        token_ids: list[int],
        snapshot: bytes | None = None,
        streamed: int | None = None,
    ) -> None:
        await self._call(self._commit(request_id, positions, token_ids, snapshot, streamed))

    def _commit(
        self,
        request_id: str,
        positions: list[int],
        token_ids: list[int],
        snapshot: bytes | None = None,
        streamed: int | None = None,
    ) -> _Call:
        positions, token_ids = check_commit(positions, token_ids)
        record = () if snapshot is None else (bytes(snapshot), int(streamed or 0))
        args = (request_id, len(positions), pack_ids(token_ids), pack_ids(positions), *record)
        return _Call("commit", self._req_keys(request_id), args, partial(_committed, request_id))

    async def adopt(self, request_id: str, owner: str) -> IndexEntry | None:
        snap = await self._run("adopt", self._req_keys(request_id), request_id, owner)
        if snap and len(snap) == 2:
            owner, address = snap[0].decode(), snap[1].decode()
            message = f"request {request_id} is decoding on orchestrator {owner}, whose lease is alive"
            raise OwnerAlive(message, owner, address)
        return self._decode(request_id, snap)

    async def orphans(self) -> list[str]:
        entry = self._req_keys("")[0]  # the prefix of every entry's key
        try:
            keys = [k async for k in self.client.scan_iter(match=_glob_escape(entry) + "*", count=1000)]
        except UNREACHABLE as e:
            raise self.unreachable(e) from e
        found = []
        for i in range(0, len(keys), ORPHAN_BATCH):
            found += await self._run("orphans", keys[i : i + ORPHAN_BATCH])
        return [k.decode()[len(entry) :] for k in found]

    async def lease(self, owner: str, ttl_s: float, address: str = "") -> None:
        try:
            await self.client.set(f"{self.prefix}lease:{owner}", address, px=max(1, round(ttl_s * 1000)))
        except UNREACHABLE as e:
            raise self.unreachable(e) from e

    async def leases(self) -> dict[str, float]:
        start = len(self.prefix) + len("lease:")
        try:
            keys = [k async for k in self.client.scan_iter(match=_glob_escape(self.prefix) + "lease:*", count=1000)]
            left = [await self.client.pttl(k) for k in keys]
        except UNREACHABLE as e:
            raise self.unreachable(e) from e
        return {k.decode()[start:]: ms / 1000 for k, ms in zip(keys, left, strict=True) if ms > 0}

    async def requests(self) -> list[str]:
        start = len(self.prefix) + len("req:")
        try:
            keys = [k async for k in self.client.scan_iter(match=_glob_escape(self.prefix) + "req:*", count=1000)]
        except UNREACHABLE as e:
            raise self.unreachable(e) from e
        return sorted(k.decode()[start:] for k in keys)

    async def get(self, request_id: str) -> IndexEntry | None:
        return self._decode(request_id, await self._run("get", self._req_keys(request_id), request_id))

    async def release(self, request_id: str) -> bool:
        return await self._call(self._release(request_id))

    def _release(self, request_id: str) -> _Call:
        return _Call("release", self._req_keys(request_id), (request_id,), bool)

    async def batch(self, ops: list[Op]) -> list[object]:
        batchable = {"put": self._put, "commit": self._commit, "place": self._place, "release": self._release}
        calls = [_prepared(batchable.get(op.method), op) for op in ops]
        sent = [call for call in calls if isinstance(call, _Call)]
        if not self._loaded:  # a pipeline cannot load a missing script and go on in order, as a single call does
            await self._load(batchable)
        pipe = self.client.pipeline(transaction=False)
        for call in sent:
            pipe.evalsha(self._scripts[call.script].sha, len(call.keys), *call.keys, self.prefix, *call.args)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except UNREACHABLE as e:
            raise self.unreachable(e) from e
        if any(isinstance(reply, NO_SCRIPT) for reply in replies):
            self._loaded = False
            raise IndexUnavailable(f"cache index ({self}) lost its scripts (a restart?): the batch ran in part")
        replies = iter(replies)
        return [call if isinstance(call, Exception) else _result(call, next(replies)) for call in calls]

    async def _load(self, names: Iterable[str]) -> None:
        try:
            for name in names:
                await self.client.script_load(self._scripts[name].script)
        except UNREACHABLE as e:
            raise self.unreachable(e) from e
        self._loaded = True

    # ------------------------------------------------------------------ replicas
    async def place(
        self, request_id: str, candidates: list[list[str]], tokens: int, budget: int | None
    ) -> list[str] | None:
        return await self._call(self._place(request_id, candidates, tokens, budget))

    def _place(self, request_id: str, candidates: list[list[str]], tokens: int, budget: int | None) -> _Call:
        budget = "" if budget is None else int(budget)
        groups = [arg for replicas in candidates for arg in (len(replicas), *replicas)]
        args = (request_id, check_tokens(tokens), budget, _ttl_ms(self.default_ttl_s), *groups)
        return _Call("place", [], args, _chosen)

    async def replica_tokens(self, replica: str) -> int:
        return int(await self._run("replica_tokens", [], replica))

    async def holdings(self, replica: str) -> dict[str, int]:
        flat = await self._run("holdings", [], replica)
        return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def replicas(self) -> list[str]:
        return sorted(r.decode() for r in await self.client.smembers(f"{self.prefix}replicas"))

    async def storage_keys(self) -> list[str]:
        await self._run("sweep_all", [])
        match = _glob_escape(self.prefix) + "*"
        return sorted([k.decode() async for k in self.client.scan_iter(match=match, count=1000)])


def json_dumps(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


def json_loads(raw: bytes) -> dict:
    return json.loads(raw)
