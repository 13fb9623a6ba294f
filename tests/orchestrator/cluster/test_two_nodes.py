"""The deployments across machines: two Ray nodes started on this machine (ray.cluster_utils.Cluster), the drafter
placed on one and the guider on the other by custom node resources (serving.resources), serve the same tokens as in
process on the transport the orchestrator uses (each replica's channel at its node's address,
services/serving/channel.py), and each round's breakdown comes back across the hop."""

import time

import pytest
import yaml

from services.cli.breakdown import from_trace
from services.cli.client import DlmClient
from services.common.config import EngineConfig
from services.orchestrator.engine.engine import Engine
from services.serving.ray_env import set_ray_env
from tests.orchestrator.cluster.test_services import free_port

pytestmark = pytest.mark.e2e

PROMPTS = ["count from 1 to 9:", "copy: a b c"]
PARAMS = {"window": 6}


def node_of(replica_actor: object) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def two_nodes(tiny_zoo, redis_url, tmp_path_factory):
    ray = pytest.importorskip("ray")
    from ray import serve
    from ray.cluster_utils import Cluster

    from services.orchestrator.cluster.app import build_app

    set_ray_env()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node_a": 1}})
    cluster.add_node(num_cpus=2, resources={"node_b": 1})
    ray.init(address=cluster.address, logging_level="ERROR")
    port = free_port()
    serving = {"redis_url": redis_url, "port": port, "resources": {"drafter": {"node_b": 1}, "guider": {"node_a": 1}}}
    config = tmp_path_factory.mktemp("two") / "dlm.yaml"
    config.write_text(yaml.safe_dump({"engine": {"models": tiny_zoo, "max_new_tokens": 16, "serving": serving}}))
    client = DlmClient(f"127.0.0.1:{port}", timeout=120)
    try:
        serve.run(build_app({"config": str(config)}), name="dlm", route_prefix=None)
        deadline = time.monotonic() + 240
        while client.health() != "SERVING":
            assert time.monotonic() < deadline, "the service never became SERVING"
            time.sleep(0.5)
        nodes = {("a" if "node_a" in n["Resources"] else "b"): n["NodeID"] for n in ray.nodes() if n["Alive"]}
        yield client, nodes, Engine(EngineConfig.from_yaml(str(config)))
    finally:
        client.close()
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def replica_node(deployment: str) -> str:
    import ray

    [name] = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if f"#{deployment}#" in a["name"]]
    return ray.get(ray.get_actor(name, namespace="serve").__ray_call__.remote(node_of))


def test_the_drafter_and_the_guider_on_two_nodes_serve_the_in_process_tokens(two_nodes):
    client, nodes, engine = two_nodes
    # the drafter on the added node, the guider on the head: not where Ray puts them unconstrained
    assert replica_node("drafter") == nodes["b"] and replica_node("guider") == nodes["a"]
    for prompt in PROMPTS:
        local = engine.generate(prompt, "pipeline", PARAMS, 16)
        served = client.generate(prompt, strategy="pipeline", params=PARAMS, max_new_tokens=16, trace=True)
        assert list(served.token_ids) == local.token_ids
        steps = [from_trace(row) for row in served.trace]
        assert all(t.compute_s["drafter"] > 0 and t.compute_s["guider"] > 0 and t.hops_s > 0 for t in steps)
