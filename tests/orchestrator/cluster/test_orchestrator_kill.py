"""No lost streams when the orchestrator dies: its replica SIGKILLed under 4 seeded streams at temperature 0.8
(pipeline, streaming, slot with kv=recompute, guided). Serve restarts it as a new owner; its sweep adopts the requests
once the dead one's lease lapsed, and each DlmClient stream reconnects and resumes: every one completes with exactly
the text of an undisturbed run, no token repeated or missing. Then the orchestrator and the drafter replica killed
together, for the causal strategies. And the same for an OpenAI chat stream through the `openai` client, which
reconnects with Last-Event-ID. A local Ray, the Serve app on tiny models, gRPC and HTTP over loopback."""

import os
import signal
import time

import pytest

from services.serving.wire import pb
from tests.orchestrator.cluster.test_services import free_port, served_app
from tests.orchestrator_kill import CASES, PROMPT, figures, killed_streams, run_streams
from tests.replica_processes import cluster_replica_pids

pytestmark = pytest.mark.e2e

TOKENS = 128  # long enough to be killed mid-stream on a loaded machine
LEASE_S = 1.0
CAUSAL = ("pipeline", "streaming", "slot")


@pytest.fixture(scope="module")
def service(tiny_zoo, tmp_path_factory):
    engine = {"models": tiny_zoo, "max_new_tokens": TOKENS, "chat_template": False, "serving": {"lease_s": LEASE_S}}
    config, http_port = tmp_path_factory.mktemp("orchestrator-kill") / "dlm.yaml", free_port()
    with served_app(engine, config, num_cpus=6, http_port=http_port) as (client, app):
        yield client, app, f"http://127.0.0.1:{http_port}"


def serving_again(client, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.health() == "SERVING":
                return
        except Exception:  # the new replica is not listening yet
            pass
        assert time.monotonic() < deadline, "the orchestrator never came back"
        time.sleep(0.5)


@pytest.mark.parametrize("also", [(), ("drafter",)], ids=["orchestrator", "orchestrator+drafter"])
def test_streams_survive_the_orchestrator_killed_under_them(service, also):
    client, app, _ = service
    serving_again(client)
    cases = [(s, p) for s, p in CASES.items() if not also or s in CAUSAL]
    seed = 70 if not also else 170
    calm = run_streams(client, cases, TOKENS, seed)

    def kill() -> None:
        [orchestrator] = cluster_replica_pids("orchestrator")
        victims = [orchestrator] + [pid for deployment in also for pid in cluster_replica_pids(deployment)]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    disturbed, killed = killed_streams(client, cases, TOKENS, seed, kill)
    ended = {pb.FINISH_REASON_EOS, pb.FINISH_REASON_LENGTH}
    assert all(d.reason in ended for d in disturbed)
    for (strategy, _), d, c in zip(cases, disturbed, calm, strict=True):
        assert (d.ids, d.text) == (c.ids, c.text), strategy
    assert any(d.arrivals[0] < killed < d.arrivals[-1] for d in disturbed), "every stream ended before the kill"
    print(f"\nkilled {('orchestrator', *also)}:", {k: round(v, 2) for k, v in figures(calm, disturbed, killed).items()})
    assert app.requests.remote().result() == []


def test_an_openai_stream_resumes_with_last_event_id_after_the_kill(service):
    """The official client sees no SSE ids: it resumes with REQUEST_ID:CHARACTERS it counted itself, retrying while
    the proxy has no orchestrator (5xx) or the dead one's lease lives (503)."""
    openai = pytest.importorskip("openai")
    client, app, base = service
    serving_again(client)
    chat = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60).chat.completions
    body = {"model": "dlm", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, "seed": 7}
    body |= {"temperature": 0.8, "extra_body": {"strategy": "pipeline", "dlm_params": {"window": 6}}}
    calm = "".join(c.choices[0].delta.content or "" for c in chat.create(stream=True, **body) if c.choices)

    held, request_id, stream = "", None, chat.create(stream=True, **body)
    for chunk in stream:
        held, request_id = held + (chunk.choices[0].delta.content or ""), chunk.id
        if len(held) >= 8:
            break
    [orchestrator] = cluster_replica_pids("orchestrator")
    os.kill(orchestrator, signal.SIGKILL)
    stream.close()
    assert len(held) < len(calm), "the stream ended before the kill"

    deadline = time.monotonic() + 120
    while True:
        try:
            resumed = chat.create(stream=True, extra_headers={"Last-Event-ID": f"{request_id}:{len(held)}"}, **body)
            rest = "".join(c.choices[0].delta.content or "" for c in resumed if c.choices)
            break
        except (openai.APIConnectionError, openai.InternalServerError) as e:  # no orchestrator yet, or its lease
            assert time.monotonic() < deadline, f"never resumed: {e}"
            time.sleep(0.5)
    assert held + rest == calm
    assert app.requests.remote().result() == []
