"""An OpenAI SSE stream resumed with Last-Event-ID, as MCP's streamable HTTP resumes: every event's id counts what
the client holds; the orchestrator that served the stream stops as a SIGKILLed one does, the official `openai`
client posts the same request again with the header, and once the first orchestrator's lease has lapsed a second
one goes on from the cache index's record, with exactly the text of an undisturbed run. Two in-process orchestrators
on one redis-server behind one uvicorn over loopback (the route's module serves one backend: attaching the second
is the restart)."""

import asyncio
import json
import uuid

import httpx2 as httpx  # the openai client's HTTP library
import pytest

from services.orchestrator.api.openai_api import api, attach
from tests.orchestrator.cluster.test_services import free_port
from tests.orchestrator.cluster.test_takeover import LEASE_S, kill, orchestrator

pytestmark = pytest.mark.anyio

CHAT = {"model": "dlm", "messages": [{"role": "user", "content": "count from 1 to 9:"}], "max_tokens": 48}
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "seed": 1234, "strategy": "pipeline", "dlm_params": {"window": 6}}


@pytest.fixture
async def http(tiny_zoo, redis_url):
    """(base URL, start(owner) -> an attached orchestrator on a shared index); kills every orchestrator after."""
    uvicorn = pytest.importorskip("uvicorn")
    prefix, started, port = f"test:{uuid.uuid4().hex[:8]}:", [], free_port()

    async def start(owner: str):
        frontend, admission = orchestrator(tiny_zoo, redis_url, prefix, owner)
        await frontend.start()
        attach(frontend, frontend.engine.config.serving.limits)
        started.append((frontend, admission))
        return frontend, admission

    config = uvicorn.Config(api, host="127.0.0.1", port=port, log_level="error", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    yield f"http://127.0.0.1:{port}", start
    server.should_exit = True
    await serving
    for frontend, admission in started:
        await kill(frontend, admission)


async def events(client: httpx.AsyncClient, base: str, headers: dict | None = None, extra: dict | None = None):
    """(id, chunk) of each SSE event of a streamed chat, as they arrive."""
    body = {**CHAT, **SAMPLED, "stream": True, **(extra or {})}
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body, headers=headers or {}) as reply:
        assert reply.status_code == 200, await reply.aread()
        event_id = None
        async for line in reply.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: ") and line != "data: [DONE]":
                yield event_id, json.loads(line[6:])


def content(chunk: dict) -> str:
    return "".join(c["delta"].get("content", "") for c in chunk["choices"])


async def test_each_event_id_counts_what_the_client_holds(http):
    base, start = http
    await start("orch-a")
    text, ids = "", []
    async with httpx.AsyncClient(timeout=60) as client:
        async for event_id, chunk in events(client, base, {}, {"stream_options": {"include_usage": True}}):
            text += content(chunk)
            request_id, chars, tokens = event_id.split(":")
            assert request_id == chunk["id"] and int(chars) == len(text)
            ids.append(int(tokens))
    assert len(text) > 0 and ids == sorted(ids)
    assert ids[-1] == chunk["usage"]["completion_tokens"]


@pytest.mark.parametrize("client_kind", ["openai", "sse"])
async def test_a_stream_resumed_with_last_event_id_has_the_undisturbed_text(http, client_kind):
    """openai: the official client, which sees no SSE ids, resumes with REQUEST_ID:CHARACTERS it counted itself;
    sse: a client that sends the last event's id back."""
    openai = pytest.importorskip("openai")
    base, start = http
    first, first_admission = await start("orch-a")
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    extra = {"extra_body": {k: SAMPLED[k] for k in ("strategy", "dlm_params")}}
    sampling = {k: SAMPLED[k] for k in ("temperature", "top_p", "seed")}

    async def chat(headers: dict | None = None):
        return await client.chat.completions.create(
            model="dlm",
            messages=CHAT["messages"],
            max_tokens=48,
            stream=True,
            extra_headers=headers,
            **sampling,
            **extra,
        )

    undisturbed = "".join([c.choices[0].delta.content or "" async for c in await chat() if c.choices])

    held, last_id = "", None
    async with httpx.AsyncClient(timeout=60) as raw:
        if client_kind == "openai":
            stream = await chat()
            async for chunk in stream:
                held, last_id = held + (chunk.choices[0].delta.content or ""), chunk.id
                if len(held) >= 4:
                    break
            await kill(first, first_admission)  # mid-stream: no further record, no lease renewal, no release
            await stream.close()
            resume_id = f"{last_id}:{len(held)}"
        else:
            async for event_id, chunk in events(raw, base):
                held, last_id = held + content(chunk), event_id
                if len(held) >= 4:
                    break
            await kill(first, first_admission)
            resume_id = last_id
    assert len(held) < len(undisturbed), "the request ended before the kill"

    await start("orch-b")
    await first_admission.writer.index.lease("orch-a", LEASE_S)  # as if it had died just after a renewal
    with pytest.raises(openai.APIStatusError) as refused:  # its owner's lease is alive: retry later
        await chat({"Last-Event-ID": resume_id})
    assert refused.value.status_code == 503 and "orch-a" in refused.value.message
    await asyncio.sleep(LEASE_S)
    stream = await chat({"Last-Event-ID": resume_id})
    rest = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert held + rest == undisturbed
    await client.close()


@pytest.mark.parametrize(
    ("last_event_id", "stream", "status", "names"),
    [
        ("no-counts", True, 400, "REQUEST_ID:CHARACTERS[:TOKENS]"),
        ("chatcmpl-x:1:2:3", True, 400, "REQUEST_ID:CHARACTERS[:TOKENS]"),
        ("chatcmpl-x:-1", True, 400, "REQUEST_ID:CHARACTERS[:TOKENS]"),
        ("chatcmpl-x:3", False, 400, "stream"),
        ("chatcmpl-gone:3:1", True, 404, "chatcmpl-gone"),
    ],
)
async def test_a_bad_last_event_id_is_refused_by_name_and_the_server_goes_on(
    http, last_event_id, stream, status, names
):
    base, start = http
    await start("orch-a")
    async with httpx.AsyncClient(timeout=60) as client:
        body = {**CHAT, "max_tokens": 4, "stream": stream}
        reply = await client.post(f"{base}/v1/chat/completions", json=body, headers={"Last-Event-ID": last_event_id})
        assert reply.status_code == status
        assert names in reply.json()["error"]["message"]
        reply = await client.post(f"{base}/v1/chat/completions", json={**CHAT, "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("length", "stop")
