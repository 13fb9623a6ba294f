"""`dlm index ls` and `dlm index show REQUEST_ID`: what the cache index holds, for people, beside the Ray dashboard:
each live request's record, the orchestrator that owns it and whether its lease lives, and the replicas that hold
its KV with the tokens reserved there. It only reads Redis; `ls` needs no torch, `show` unpickles the record's
snapshot (its prompt and sampling) and so loads it."""

import asyncio
import json
from dataclasses import dataclass

from services.common.config import EngineConfig
from services.serving.cache_index import CacheIndex, IndexEntry, IndexUnavailable
from services.serving.indexes import make_index

COLUMNS = ("REQUEST", "STRATEGY", "OWNER", "LEASE", "REPLICAS", "COMMITTED", "STREAMED")
SHOWN_IDS = 16  # of the committed positions and ids, show prints the first ones


@dataclass(slots=True)
class Held:
    """A request's record as the index holds it, with its owner's lease and its reservations."""

    entry: IndexEntry
    lease_s: float | None  # seconds its owner's lease has left; None: lapsed (or no owner)
    reserved: dict[str, int]  # replica -> KV tokens reserved for it there


def index_ls(args) -> int:
    held = read(args, None)
    if not held:
        print("no live request in the cache index")
        return 0
    rows = [COLUMNS, *(row(h) for h in held)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for r in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip())
    return 0


def index_show(args) -> int:
    (h,) = read(args, args.request_id)
    e = h.entry
    print(f"request    {e.request_id}")
    print(f"strategy   {e.strategy} {json.dumps(e.params, sort_keys=True)}")
    print(f"owner      {e.owner or '-'} (lease {lease(h.lease_s)})")
    print(*decode_state(e.snapshot), sep="\n")
    print(f"committed  {e.committed_len} tokens, {out_of_order(e.order)} of them ahead of the frontier when committed")
    print(f"  order    {summary(e.order)}")
    print(f"  ids      {summary(e.token_ids)}")
    print(f"streamed   {e.streamed} tokens")
    print(f"replicas   drafter {e.drafter or '-'}, guider {e.guider or '-'}")
    print(f"reserved   {', '.join(f'{r} {n} tokens' for r, n in h.reserved.items()) or '-'}")
    print(f"ttl        {'-' if e.ttl_s is None else f'{e.ttl_s:g} s'} after its last write")
    return 0


def read(args, request_id: str | None) -> list[Held]:
    """Every record (request_id None) or one; ValueError names what is missing or unreachable."""
    url = args.redis_url or EngineConfig.from_yaml(args.config).serving.redis_url
    if not url:
        raise ValueError("no cache index to read: give --redis-url URL (the config's serving.redis_url is unset)")
    index = make_index(url)
    try:
        return asyncio.run(gather(index, request_id))
    except IndexUnavailable as e:
        raise ValueError(str(e)) from None


async def gather(index: CacheIndex, request_id: str | None) -> list[Held]:
    try:
        ids = [request_id] if request_id is not None else await index.requests()
        leases = await index.leases()
        holdings = {replica: await index.holdings(replica) for replica in await index.replicas()}
        held = []
        for rid in ids:
            entry = await index.get(rid)
            if entry is None and request_id is not None:
                raise ValueError(f"request {rid!r} has no record in the cache index: it ended, or never started")
            if entry is not None:  # else it ended between the listing and the read
                reserved = {r: tokens[rid] for r, tokens in holdings.items() if rid in tokens}
                held.append(Held(entry, leases.get(entry.owner or ""), reserved))
        return held
    finally:
        await index.close()


def row(h: Held) -> tuple[str, ...]:
    e = h.entry
    replicas = ",".join(h.reserved) or "-"
    return (e.request_id, e.strategy, e.owner or "-", lease(h.lease_s), replicas, str(e.committed_len), str(e.streamed))


def lease(left_s: float | None) -> str:
    return "lapsed" if left_s is None else f"alive {left_s:.1f}s"


def decode_state(snapshot: bytes) -> list[str]:
    """The prompt and sampling lines, from the record's snapshot (the pickled request)."""
    if not snapshot:
        return ["prompt     - (no snapshot)"]
    from services.orchestrator.cluster.admission import restore

    req = restore(snapshot)
    s = req.sampling
    return [
        f"prompt     {req.prompt_len} tokens, max_new_tokens {req.max_new_tokens}, {req.stats.rounds} rounds done",
        f"sampling   temperature {s.temperature:g}, top_p {s.top_p:g}, top_k {s.top_k}, seed {s.seed}",
    ]


def out_of_order(order: list[int]) -> int:
    """Commits made ahead of the frontier (the first position not yet committed): slots committed out of order."""
    ahead, frontier, done = 0, 0, set()
    for position in order:
        ahead += position != frontier
        done.add(position)
        while frontier in done:
            frontier += 1
    return ahead


def summary(values: list[int]) -> str:
    shown = " ".join(map(str, values[:SHOWN_IDS]))
    return shown + (f" ... ({len(values)} in all)" if len(values) > SHOWN_IDS else "") if values else "-"
