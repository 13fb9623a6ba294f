"""Colocated serving (serving.colocate): one model deployment, `models`, whose replicas run every host, serves token for
token what the engine gives in process, with every strategy's hosts on one replica; its forwards run on one torch
thread per core, and separate deployments' on serving.replica_threads. A local Ray, the Serve app on tiny models, gRPC
over loopback. Its replica's death: tests/orchestrator/cluster/test_resumption.py."""

from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from services.common.config import EngineConfig
from services.orchestrator.engine.engine import Engine
from tests.orchestrator.cluster.test_services import (  # noqa: F401  its test runs here on this module's service
    CASES,
    served_app,
    sixteen_streams_equal_in_process,
    streamed,
    test_stream_equals_unary_equals_in_process,
)
from tests.replica_processes import forward_threads

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def service(redis_url, tiny_zoo, tmp_path_factory):
    serving = {"redis_url": redis_url, "colocate": True, "replicas": {"models": 2}}
    config = tmp_path_factory.mktemp("colocated") / "dlm.yaml"
    with served_app({"models": tiny_zoo, "max_new_tokens": 16, "serving": serving}, config) as (client, app):
        yield client, app, Engine(EngineConfig.from_yaml(str(config)))


def test_one_deployment_runs_every_model(service):
    from ray import serve

    deployments = serve.status().applications["dlm"].deployments
    assert sorted(deployments) == ["models", "orchestrator"]


def test_sixteen_concurrent_streams_equal_in_process_on_both_replicas(service):
    client, app, engine = service
    sixteen_streams_equal_in_process(client, engine, first_seed=400)
    sizes = app.batch_sizes.remote().result()
    assert max(int(k) for k in sizes["drafter"]) > 1, sizes


def test_a_request_keeps_its_drafter_and_guider_kv_on_one_replica(service):
    client, app, _ = service
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(lambda: streamed(client, "pipeline", CASES["pipeline"], request_id="colocated-kv"))
        placed = {}
        while not stream.done() and "colocated-kv" not in placed:
            placed = app.placements.remote().result()
        assert stream.result()[0]
    if "colocated-kv" in placed:  # seen while it ran
        where = placed["colocated-kv"]
        assert where["drafter"] == where["guider"], where


def test_a_colocated_replica_computes_on_one_thread_per_core(service):
    assert forward_threads("models") == {psutil.cpu_count(logical=False)}
