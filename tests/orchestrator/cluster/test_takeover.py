"""Takeover from the cache index's record: an orchestrator stops mid-stream (nothing more of it reaches Redis), a
second one adopts the request once the first one's lease has lapsed, never before, rebuilds it from the record alone
(its own hosts hold no KV of it) and the client's stream goes on with exactly the text of an undisturbed run, no
token repeated or missing, although the record is rounds behind what the client received. Seeded sampling at
temperature > 0; two in-process orchestrators on one redis-server."""

import asyncio
import uuid

import grpc
import pytest

from services.cli.client import DlmClient
from services.common.config import EngineConfig
from services.common.sampling import SamplingParams
from services.orchestrator.api.deltas import Deltas
from services.orchestrator.api.frontend import Detached, Frontend, Spec
from services.orchestrator.api.grpc_server import Server
from services.orchestrator.cluster.admission import IndexAdmission
from services.orchestrator.cluster.sweep import Sweep
from services.orchestrator.engine.engine import Engine
from services.orchestrator.engine.local_executor import LocalExecutor
from services.serving.cache_index import IndexEntry, OwnerAlive
from services.serving.redis_index import RedisCacheIndex
from services.serving.wire import pb
from tests.orchestrator.cluster.test_services import free_port

pytestmark = pytest.mark.anyio

PROMPT = "count from 1 to 9:"
LEASE_S = 0.5
CASES = {
    "pipeline": {"window": 6},
    "streaming": {"window": 6},
    "slot": {"slot_size": 4, "block_size": 8, "kv": "recompute"},
    "guided": {"block_size": 8},  # the bidirectional drafter's frozen blocks (freecache) run ahead of the record
}


def orchestrator(
    tiny_zoo, redis_url: str, prefix: str, owner: str, executor: LocalExecutor | None = None
) -> tuple[Frontend, IndexAdmission]:
    """An orchestrator with an admission of its own on the shared index, on these hosts or on hosts of its own."""
    config = EngineConfig(models=tiny_zoo, max_new_tokens=48)
    executor = executor or LocalExecutor(config)
    index = RedisCacheIndex.from_url(redis_url, prefix=prefix)
    admission = IndexAdmission(index, executor.placement, 60, owner, LEASE_S)
    return Frontend(Engine(config, executor, admission), records=admission), admission


def spec(strategy: str, request_id: str) -> Spec:
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)
    return Spec(PROMPT, 48, strategy, CASES[strategy], sampling, request_id)


async def drained(admission: IndexAdmission) -> None:
    """Until the index holds what the orchestrator wrote so far (on a loaded machine a record may lag a round)."""
    while admission.writer.queue:
        await asyncio.sleep(0.005)


async def halt(task: asyncio.Task) -> None:
    """Cancel until it ends: redis-py swallows a cancel that comes while it waits for a reply."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.01)


async def kill(frontend: Frontend, admission: IndexAdmission) -> None:
    """Stop as a SIGKILLed process does: no release, no further write, no lease renewal."""
    for task in [*frontend.drivers, admission.writer.task, admission.reserver.task]:
        await halt(task)


@pytest.fixture
async def start(tiny_zoo, redis_url):
    """Starts orchestrators on one index of their own; kills them all at the end, so that a test that fails leaves
    no task behind (the event loop's close would wait on them)."""
    prefix, started = f"test:{uuid.uuid4().hex[:8]}:", []

    async def start(owner: str, executor: LocalExecutor | None = None) -> tuple[Frontend, IndexAdmission]:
        started.append(orchestrator(tiny_zoo, redis_url, prefix, owner, executor))
        await started[-1][0].start()
        return started[-1]

    yield start
    for frontend, admission in started:
        await kill(frontend, admission)


# guided on new hosts is a lost drafter replica too: its block cache restarts, and its text may differ (README)
MOVES = [(s, h) for s in CASES for h in ("same", "new") if (s, h) != ("guided", "new")]


@pytest.mark.parametrize("record", ["behind", "ahead"])
@pytest.mark.parametrize(("strategy", "hosts"), MOVES)
async def test_an_adopted_stream_goes_on_with_the_undisturbed_text(start, strategy, hosts, record):
    """hosts: the adopter's; "same" still hold the request's KV, of rounds past its record, "new" hold none.
    record: behind the client's stream (rounds to decode again) or ahead of it (tokens to send again)."""
    first, first_admission = await start("orch-a")
    calm = Deltas(await first.open(spec(strategy, "calm")), first.detokenizer())
    undisturbed = [(d.ids, d.text) async for d in calm]
    want_ids, want_text = [i for ids, _ in undisturbed for i in ids], "".join(t for _, t in undisturbed)

    job = await first.open(spec(strategy, "moved"))
    stream, index = Deltas(job, first.detokenizer()).__aiter__(), first_admission.writer.index
    got = [await stream.__anext__()]
    if record == "behind":  # no record after this one reaches the index: the client gets rounds it does not have
        while await index.get("moved") is None:  # its first record is written (on a loaded machine, not yet)
            await asyncio.sleep(0.005)
        await halt(first_admission.writer.task)
        while sum(len(d.ids) for d in got) <= (await index.get("moved")).streamed:
            got.append(await stream.__anext__())
    else:  # the record has rounds whose tokens the client has not received
        while first_admission.records["moved"].entry.streamed <= len(got[0].ids):
            await asyncio.sleep(0)  # a step at a time: the engine's step waits on its thread
        for driver in first.drivers:
            await halt(driver)
        while first_admission.writer.queue:
            await asyncio.sleep(0.005)
        assert (await index.get("moved")).streamed > len(got[0].ids)
    await kill(first, first_admission)
    held_ids, held_text = [i for d in got for i in d.ids], "".join(d.text for d in got)
    assert len(held_ids) < len(want_ids), "the request ended before the kill"

    executor = first.engine.executor if hosts == "same" else None
    second, _ = await start("orch-b", executor)
    await index.lease("orch-a", LEASE_S)  # as if it had died just after a renewal
    with pytest.raises(OwnerAlive, match="orch-a"):  # its lease is still alive
        await second.resume(spec(strategy, "moved"))
    await asyncio.sleep(LEASE_S)
    resumed = Deltas(await second.resume(spec(strategy, "moved")), second.detokenizer())
    resumed.held_ids, resumed.held_chars = len(held_ids), len(held_text)
    rest = [(d.ids, d.text) async for d in resumed]
    assert held_ids + [i for ids, _ in rest for i in ids] == want_ids
    assert held_text + "".join(t for _, t in rest) == want_text
    await second.shutdown()


async def undisturbed(frontend: Frontend, strategy: str) -> tuple[list[int], str]:
    calm = Deltas(await frontend.open(spec(strategy, f"calm-{uuid.uuid4().hex[:6]}")), frontend.detokenizer())
    deltas = [d async for d in calm]
    return [i for d in deltas for i in d.ids], "".join(d.text for d in deltas)


async def rest_of(frontend: Frontend, strategy: str, held_ids: list[int], held_text: str) -> tuple[list[int], str]:
    """What a client that holds held_ids / held_text reads once it resumes its request "moved" here."""
    resumed = Deltas(await frontend.resume(spec(strategy, "moved")), frontend.detokenizer())
    resumed.held_ids, resumed.held_chars = len(held_ids), len(held_text)
    deltas = [d async for d in resumed]
    return held_ids + [i for d in deltas for i in d.ids], held_text + "".join(d.text for d in deltas)


async def test_a_resume_on_the_live_owner_takes_the_stream_over(start):
    """The client's stream broke but its orchestrator lives: the resume attaches to the live request (no second
    decode, no ALREADY_EXISTS), the old stream ends Detached, and the text is the undisturbed one."""
    first, _ = await start("orch-a")
    want = await undisturbed(first, "pipeline")
    old = Deltas(await first.open(spec("pipeline", "moved")), first.detokenizer()).__aiter__()
    got = [await old.__anext__()]
    ids, text = await rest_of(first, "pipeline", got[0].ids, got[0].text)
    assert (ids, text) == want
    with pytest.raises(Detached):
        while True:
            await old.__anext__()
    assert first.live() == []


@pytest.mark.parametrize("reconnect", ["while-decoding", "after-the-end"])
async def test_the_sweep_adopts_an_orphan_and_keeps_it_for_its_client(start, reconnect):
    """No request is orphaned: once its orchestrator's lease lapses a live one's sweep adopts it, decodes it with no
    client attached, and hands it to the client that resumes, mid-way or after it ended, with the undisturbed text.
    A second sweeper never wins it twice."""
    first, first_admission = await start("orch-a")
    want = await undisturbed(first, "slot")
    stream = Deltas(await first.open(spec("slot", "moved")), first.detokenizer()).__aiter__()
    got = [await stream.__anext__()]
    await drained(first_admission)
    await kill(first, first_admission)
    second, second_admission = await start("orch-b")
    third, third_admission = await start("orch-c")
    sweeps = [Sweep(o, a.writer.index, LEASE_S) for o, a in ((second, second_admission), (third, third_admission))]
    await first_admission.writer.index.lease("orch-a", LEASE_S)  # as if it had died just after a renewal
    assert await sweeps[0].once() == []  # its lease still lives
    await asyncio.sleep(LEASE_S)
    won = [await sweep.once() for sweep in sweeps]
    assert won == [["moved"], []]
    if reconnect == "after-the-end":
        while second.live():
            await asyncio.sleep(0.01)
    assert await rest_of(second, "slot", got[0].ids, got[0].text) == want


@pytest.fixture
async def serve_on(tiny_zoo, redis_url):
    """Starts gRPC servers over orchestrators on one index of their own, on a port given; kills them at the end."""
    prefix, started = f"test:{uuid.uuid4().hex[:8]}:", []

    async def serve_on(port: int, owner: str) -> tuple[Server, IndexAdmission]:
        frontend, admission = orchestrator(tiny_zoo, redis_url, prefix, owner)
        server = Server(frontend)
        await server.start(f"127.0.0.1:{port}")
        await server.loading
        started.append((server, admission))
        return started[-1]

    yield serve_on
    for server, admission in started:
        await sigkill(server, admission)


async def sigkill(server: Server, admission: IndexAdmission) -> None:
    """As a SIGKILL: the orchestrator stops (no release, no write, no lease renewal), its connections drop."""
    await kill(server.backend, admission)
    await server.server.stop(None)


@pytest.mark.parametrize("record", ["kept", "gone"])
async def test_dlm_client_resumes_across_its_orchestrator_killed(serve_on, record):
    """DlmClient's stream breaks when its orchestrator dies; it reconnects to the same address, where another
    orchestrator comes up, and resumes: the user reads one uninterrupted text, that of an undisturbed run. A request
    whose record is gone answers NOT_FOUND, which the client does not retry."""
    port = free_port()
    first, first_admission = await serve_on(port, "orch-a")
    client = DlmClient(f"127.0.0.1:{port}", timeout=60, resume_timeout=30)
    kwargs = dict(strategy="pipeline", params=CASES["pipeline"], max_new_tokens=48, temperature=0.8, seed=1234)
    want = await asyncio.to_thread(client.generate, PROMPT, **kwargs)

    chunks, received = client.stream(PROMPT, request_id="moved", **kwargs), []
    event = await asyncio.to_thread(next, chunks)
    received.append(event)
    for driver in first.backend.drivers:  # decoding stops first: else the request could end while the index drains
        await halt(driver)
    await drained(first_admission)
    await sigkill(first, first_admission)
    if record == "gone":
        await first_admission.writer.index.release("moved")
    await serve_on(port, "orch-b")
    if record == "gone":
        with pytest.raises(grpc.RpcError) as error:
            await asyncio.to_thread(list, chunks)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        return
    received += await asyncio.to_thread(list, chunks)
    texts = [e.text for e in received if isinstance(e, pb.Chunk)]
    ids = [i for e in received if isinstance(e, pb.Chunk) for i in e.token_ids]
    assert "".join(texts) == want.text and ids == list(want.token_ids)
    assert isinstance(received[-1], pb.Complete) and received[-1].finish_reason == want.finish_reason
    client.close()


async def test_a_resume_on_a_non_owner_is_relayed_from_the_owner(serve_on):
    """Two orchestrators behind one address: the reconnect lands on the one that does not decode the request, which
    relays it from the owner's private address (recorded with its lease); the owner attaches it to the live request,
    whose previous stream ends ABORTED, and the client reads the undisturbed text."""
    owner_port, other_port = free_port(), free_port()
    await serve_on(owner_port, "orch-a")
    await serve_on(other_port, "orch-b")
    owner = DlmClient(f"127.0.0.1:{owner_port}", timeout=60, resume_timeout=0)
    kwargs = dict(strategy="streaming", params=CASES["streaming"], max_new_tokens=48, temperature=0.8, seed=1234)
    want = await asyncio.to_thread(owner.generate, PROMPT, **kwargs)

    request = DlmClient.request(PROMPT, request_id="moved", **kwargs)
    old = owner.open_stream(request)
    first = await asyncio.to_thread(next, old)
    request.resume.CopyFrom(pb.Resume(tokens_received=len(first.chunk.token_ids), text_received=len(first.chunk.text)))
    other = DlmClient(f"127.0.0.1:{other_port}", timeout=60, resume_timeout=0)
    rest = await asyncio.to_thread(list, other.open_stream(request))
    text = first.chunk.text + "".join(m.chunk.text for m in rest if m.HasField("chunk"))
    ids = [*first.chunk.token_ids, *(i for m in rest if m.HasField("chunk") for i in m.chunk.token_ids)]
    assert (text, ids) == (want.text, list(want.token_ids))
    with pytest.raises(grpc.RpcError) as ended:
        await asyncio.to_thread(list, old)
    assert ended.value.code() == grpc.StatusCode.ABORTED
    owner.close()
    other.close()


async def test_dlm_client_generate_resumes_when_its_call_breaks(serve_on):
    """A unary Generate whose orchestrator dies once it holds the request (its headers named it) goes on as a
    resumed stream: the response is the undisturbed one."""
    port = free_port()
    first, first_admission = await serve_on(port, "orch-a")
    client = DlmClient(f"127.0.0.1:{port}", timeout=60, resume_timeout=30)
    kwargs = dict(strategy="slot", params=CASES["slot"], max_new_tokens=48, temperature=0.8, seed=1234)
    want = await asyncio.to_thread(client.generate, PROMPT, **kwargs)
    call = asyncio.create_task(asyncio.to_thread(client.generate, PROMPT, request_id="moved", **kwargs))
    index = first_admission.writer.index
    while not (await index.get("moved") or IndexEntry("")).streamed:  # decoding, with a record
        await asyncio.sleep(0.005)
    await sigkill(first, first_admission)
    await serve_on(port, "orch-b")
    got = await call
    assert (got.text, list(got.token_ids), got.finish_reason) == (want.text, list(want.token_ids), want.finish_reason)
    client.close()


async def test_dlm_client_sends_anew_a_request_its_dead_orchestrator_never_recorded(serve_on):
    """The orchestrator took the request (its headers named it) and died before recording it or sending a token:
    the resume finds no record (NOT_FOUND), and the client, having seen nothing, sends the request anew."""
    port = free_port()
    first, first_admission = await serve_on(port, "orch-a")
    client = DlmClient(f"127.0.0.1:{port}", timeout=60, resume_timeout=30)
    kwargs = dict(strategy="pipeline", params=CASES["pipeline"], max_new_tokens=48, temperature=0.8, seed=1234)
    want = await asyncio.to_thread(client.generate, PROMPT, **kwargs)
    await kill(first.backend, first_admission)  # it still answers gRPC, but decodes and records nothing
    stream = asyncio.create_task(asyncio.to_thread(list, client.stream(PROMPT, request_id="unseen", **kwargs)))
    while "unseen" not in first.backend.jobs:
        await asyncio.sleep(0.005)
    await first.server.stop(None)
    await serve_on(port, "orch-b")
    events = await stream
    assert "".join(e.text for e in events if isinstance(e, pb.Chunk)) == want.text
    client.close()
