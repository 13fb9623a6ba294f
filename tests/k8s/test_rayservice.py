"""What the RayService must keep true for dlm-serve-svc to reach the orchestrator's gRPC port, and for the Ray pods
to run restricted; each check mirrors how KubeRay or Ray reads the manifest."""

import json

import pytest
import yaml

from services.common.config import SECRET_ENV, EngineConfig
from services.serving.ray_env import RAY_ENV
from tests.k8s.manifests import find

RAYSERVICE = find("RayService", "dlm")
CLUSTER = RAYSERVICE["spec"]["rayClusterConfig"]
GROUPS = {g["groupName"]: g for g in CLUSTER["workerGroupSpecs"]}
SERVE_CONFIG = yaml.safe_load(RAYSERVICE["spec"]["serveConfigV2"])
ENGINE = yaml.safe_load(find("ConfigMap", "dlm-config")["data"]["dlm.yaml"])["engine"]


def container(group: dict) -> dict:
    return group["template"]["spec"]["containers"][0]


def pod_groups() -> dict[str, dict]:
    return {"head": CLUSTER["headGroupSpec"], **GROUPS}


def test_the_configmap_is_a_valid_engine_config():
    EngineConfig(**ENGINE)  # unknown keys or bad values raise


def test_the_serve_service_carries_exactly_the_grpc_port():
    # KubeRay copies the head container's ports named `serve` or `serve-*` into dlm-serve-svc, port = targetPort
    ports = {p["name"]: p["containerPort"] for p in container(CLUSTER["headGroupSpec"])["ports"]}
    served = {name: port for name, port in ports.items() if name == "serve" or name.startswith("serve-")}
    assert served == {"serve-grpc": ENGINE["serving"]["port"]}


def test_the_orchestrator_runs_only_on_the_pod_whose_readiness_is_its_grpc_health():
    orchestrator = next(d for d in SERVE_CONFIG["applications"][0]["deployments"] if d["name"] == "orchestrator")
    (resource,) = orchestrator["ray_actor_options"]["resources"]
    offering = [
        name
        for name, group in pod_groups().items()
        if resource in json.loads(json.loads(group["rayStartParams"].get("resources", '"{}"')))
    ]
    assert offering == ["orchestrator"]
    probe = container(GROUPS["orchestrator"])["readinessProbe"]
    assert probe["grpc"]["port"] == ENGINE["serving"]["port"]
    assert ENGINE["serving"]["host"] == "0.0.0.0"


def test_each_orchestrator_replica_has_a_pod_of_its_own():
    """serving.replicas.orchestrator replicas, each asking one dlm_orchestrator, which each orchestrator pod offers
    once: every replica runs, each on its own pod behind dlm-serve-svc, and a lost pod takes one replica only."""
    replicas = ENGINE["serving"]["replicas"]["orchestrator"]
    assert replicas == 2
    orchestrator = next(d for d in SERVE_CONFIG["applications"][0]["deployments"] if d["name"] == "orchestrator")
    assert "num_replicas" not in orchestrator  # the ConfigMap's count (build_app) is the one
    (resource,) = orchestrator["ray_actor_options"]["resources"]
    group = GROUPS["orchestrator"]
    offered = json.loads(json.loads(group["rayStartParams"]["resources"]))[resource]
    assert orchestrator["ray_actor_options"]["resources"][resource] == offered == 1
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == replicas
    budget = find("PodDisruptionBudget", "dlm-orchestrator")["spec"]
    assert budget["maxUnavailable"] == replicas - 1


def test_only_the_orchestrator_pod_can_be_a_serve_service_endpoint():
    # the head: excluded from the label; the GPU workers: no Serve proxy, so KubeRay's readiness probe fails there
    assert RAYSERVICE["spec"]["excludeHeadPodFromServeSvc"] is True
    assert SERVE_CONFIG["proxy_location"] == "HeadOnly"
    assert "readinessProbe" not in container(GROUPS["gpu"])  # keep KubeRay's proxy check there
    assert "readinessProbe" not in container(CLUSTER["headGroupSpec"])  # a gRPC probe would deadlock the deploy


def test_the_serve_config_is_valid_for_ray_serve():
    schema = pytest.importorskip("ray.serve.schema")
    schema.ServeDeploySchema.model_validate(SERVE_CONFIG)


def test_the_redis_passwords_come_only_from_a_secret():
    password = CLUSTER["gcsFaultToleranceOptions"]["redisPassword"]
    assert set(password) == {"valueFrom"} and set(password["valueFrom"]) == {"secretKeyRef"}
    redis = find("Deployment", "dlm-redis")["spec"]["template"]["spec"]["containers"][0]
    args = redis["args"]
    starts = [i for i, word in enumerate(args) if word == "--user"] + [len(args)]
    users = {args[i + 1]: args[i + 2 : j] for i, j in zip(starts, starts[1:], strict=False)}  # user -> its ACL rules
    by_name = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in redis["env"]}
    secret_of = {user: [by_name[n] for n in by_name if f">$({n})" in rules] for user, rules in users.items()}
    assert secret_of["ray-gcs"] == [password["valueFrom"]["secretKeyRef"]]
    orchestrator = {e["name"]: e for e in container(pod_groups()["orchestrator"])["env"]}
    assert secret_of["default"] == [orchestrator["DLM_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]]
    assert all("nopass" not in rules for rules in users.values())


def test_the_orchestrators_secrets_come_only_from_secrets():
    env = {e["name"]: e for e in container(pod_groups()["orchestrator"])["env"]}
    for name in SECRET_ENV:
        assert set(env[name]) == {"name", "valueFrom"} and set(env[name]["valueFrom"]) == {"secretKeyRef"}


@pytest.mark.parametrize("group", ["head", "orchestrator", "gpu"])
def test_ray_pods_run_restricted(group):
    spec = pod_groups()[group]["template"]["spec"]
    pod, ctr = spec["securityContext"], container(pod_groups()[group])
    assert pod["runAsNonRoot"] is True and pod["seccompProfile"]["type"] == "RuntimeDefault"
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in volumes[tmp["name"]]


@pytest.mark.parametrize("group", ["head", "orchestrator", "gpu"])
def test_ray_pods_serve_in_the_mode_dlm_serve_measured(group):
    """The Serve settings of services/serving/ray_env.py hold on every Ray pod (niceness is for local clients)."""
    env = {e["name"]: e.get("value") for e in container(pod_groups()[group])["env"]}
    for name, value in RAY_ENV.items():
        if name.startswith("RAY_SERVE_"):
            assert env.get(name) == value, name
