"""Two orchestrator replicas behind one address: a local Ray, the Serve app on tiny models with
serving.replicas.orchestrator 2, gRPC on one shared port, the OpenAI API through the Serve proxy on a free port, the
cache index on the suite's redis-server. New connections reach both replicas (each request's owner in the index
names the replica decoding it), and both decode the text the in-process engine decodes. Under 32 concurrent streams
over both, the KV the model replicas hold never exceeds their budget: one ledger in the index."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import redis
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.client import DlmClient
from services.common.config import EngineConfig
from services.orchestrator.engine.engine import Engine
from services.serving.ray_env import set_ray_env
from services.serving.wire import rpc
from tests.orchestrator.cluster.test_services import free_port

pytestmark = pytest.mark.e2e

PROMPT, STRATEGY, PARAMS, TOKENS = "count from 1 to 9:", "streaming", {"window": 6}, 96
STREAMS = 12  # fresh connections: all of them on one replica by chance is 2 ** -11
BUDGET = 4 * (16 + TOKENS)  # KV tokens per model replica: 4 requests of a prompt of at most 16 tokens


@pytest.fixture(scope="module")
def service(tiny_zoo, redis_url, tmp_path_factory):
    """(gRPC target, OpenAI client, Serve app handle, Redis client, the in-process engine's text)."""
    openai = pytest.importorskip("openai")
    ray = pytest.importorskip("ray")
    from ray import serve

    from services.orchestrator.cluster.app import build_app

    port, http_port = free_port(), free_port()
    config = tmp_path_factory.mktemp("orchestrators") / "dlm.yaml"
    serving = {"port": port, "redis_url": redis_url, "replicas": {"orchestrator": 2}, "micro_batches": 1}
    serving["kv_budget_tokens"] = BUDGET
    engine = {"models": tiny_zoo, "max_new_tokens": TOKENS, "chat_template": False, "serving": serving}
    config.write_text(yaml.safe_dump({"engine": engine}))
    expected = Engine(EngineConfig.from_yaml(str(config))).generate(PROMPT, STRATEGY, PARAMS, TOKENS).text
    set_ray_env()
    ray.init(num_cpus=6, include_dashboard=False, logging_level="ERROR")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        app = serve.run(build_app({"config": str(config)}), name="dlm", route_prefix="/")
        target = f"127.0.0.1:{port}"
        both_serving(target)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="-", timeout=120, max_retries=0)
        index = redis.Redis.from_url(redis_url)
        yield target, client, app, index, expected
        client.close()
        index.close()
    finally:
        serve.shutdown()
        ray.shutdown()


def fresh(target: str) -> grpc.Channel:
    """A channel on a connection of its own (gRPC shares connections between a process's channels)."""
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def both_serving(target: str) -> None:
    """Until 16 fresh connections in a row reach a SERVING replica: both have loaded (by chance one alone: 2 ** -16)."""
    deadline, serving = time.monotonic() + 180, 0
    while serving < 16:
        assert time.monotonic() < deadline, "the orchestrators never both became SERVING"
        with fresh(target) as channel:
            try:
                status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            except grpc.RpcError:
                status = None
        serving = serving + 1 if status == health_pb2.HealthCheckResponse.SERVING else 0
        time.sleep(0 if serving else 0.2)


def replicas(app) -> set[str]:
    """Both orchestrator replicas' ids (a handle call reaches either)."""
    ids: set[str] = set()
    deadline = time.monotonic() + 60
    while len(ids) < 2:
        assert time.monotonic() < deadline, f"only {ids} answered"
        ids.add(app.replica.remote().result())
    return ids


def owner(index: redis.Redis, request_id: str) -> str:
    """The orchestrator decoding the request, as its record in the index says."""
    for _ in range(200):
        found = index.hget(f"dlm:req:{request_id}", "owner")
        if found:
            return found.decode()
        time.sleep(0.01)
    raise AssertionError(f"{request_id} has no record")


def stream(target: str, index: redis.Redis, request_id: str) -> tuple[str, str]:
    """A stream on a fresh connection -> (the orchestrator that decoded it, its text)."""
    with fresh(target) as channel:
        request = DlmClient.request(
            PROMPT, strategy=STRATEGY, params=PARAMS, max_new_tokens=TOKENS, request_id=request_id
        )
        text, by = "", None
        for message in rpc.DlmServiceStub(channel).GenerateStream(request, timeout=120):
            if message.WhichOneof("event") == "chunk":
                by = by or owner(index, request.request_id)
                text += message.chunk.text
        return by, text


def test_fresh_grpc_connections_reach_both_orchestrators(service):
    target, _, app, index, expected = service
    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(lambda i: stream(target, index, f"grpc-{i}"), range(STREAMS)))
    assert [text for _, text in results] == [expected] * STREAMS
    assert {by for by, _ in results} == replicas(app)


def test_two_orchestrators_never_give_a_model_replica_more_kv_than_its_budget(service):
    """Each orchestrator alone would admit 4 requests: with a ledger each, 8 would run at once."""
    target, _, app, index, expected = service
    held, done = [], threading.Event()

    def watch() -> None:  # what each model replica's KVManager holds, through an orchestrator
        while not done.is_set():
            live = app.live.remote().result()
            held.append({role: sum(live[role].values()) for role in ("drafter", "guider")})

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda i: stream(target, index, f"budget-{i}"), range(32)))
    finally:
        done.set()
        watcher.join()
    assert [text for _, text in results] == [expected] * 32
    assert {by for by, _ in results} == replicas(app)
    peak = {role: max(h[role] for h in held) for role in ("drafter", "guider")}
    assert max(peak.values()) <= BUDGET, peak
    assert max(peak.values()) > BUDGET // 2, f"never near the budget, so nothing was checked: {peak}"


def test_the_openai_api_reaches_both_orchestrators(service):
    _, client, app, index, expected = service

    def complete(i: int) -> tuple[str, str]:
        chunks = client.completions.create(
            model="dlm",
            prompt=PROMPT,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            extra_body={"strategy": STRATEGY, "dlm_params": PARAMS},
        )
        text, by = "", None
        for chunk in chunks:
            by = by or owner(index, chunk.id)
            text += chunk.choices[0].text if chunk.choices else ""
        return by, text

    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(complete, range(STREAMS)))
    assert [text for _, text in results] == [expected] * STREAMS
    assert {by for by, _ in results} == replicas(app)
