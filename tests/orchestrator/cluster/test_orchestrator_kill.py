"""No lost streams when the orchestrator dies: its replica SIGKILLed under 4 seeded streams at temperature 0.8
(pipeline, streaming, slot with kv=recompute, guided). Serve restarts it as a new owner; its sweep adopts the requests
once the dead one's lease lapsed, and each DlmClient stream reconnects and resumes: every one completes with exactly
the text of an undisturbed run, no token repeated or missing. Then the orchestrator and the drafter replica killed
together, for the causal strategies. A local Ray, the Serve app on tiny models, gRPC over loopback."""

import os
import signal
import time

import pytest

from services.serving.wire import pb
from tests.orchestrator.cluster.test_services import served_app
from tests.orchestrator_kill import CASES, figures, killed_streams, run_streams
from tests.replica_processes import cluster_replica_pids

pytestmark = pytest.mark.e2e

TOKENS = 128  # long enough to be killed mid-stream on a loaded machine
LEASE_S = 1.0
CAUSAL = ("pipeline", "streaming", "slot")


@pytest.fixture(scope="module")
def service(tiny_zoo, tmp_path_factory):
    engine = {"models": tiny_zoo, "max_new_tokens": TOKENS, "chat_template": False, "serving": {"lease_s": LEASE_S}}
    config = tmp_path_factory.mktemp("orchestrator-kill") / "dlm.yaml"
    with served_app(engine, config, num_cpus=6) as (client, app):
        yield client, app


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
    client, app = service
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
