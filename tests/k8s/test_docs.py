"""What k8s/README.md and the main README say about the manifests holds: the GPU pods the model replicas need, the
drafter's replica bounds and how calls reach a replica, Service names, the Redis users and volume, where the image is
set, and the PodMonitor."""

import re

import yaml

from services.common.config import ROLES
from tests.k8s.manifests import K8S_DIR, find, kustomization, manifests

K8S_README = " ".join((K8S_DIR / "README.md").read_text().split())  # one space between words: phrases span lines
README = " ".join((K8S_DIR.parent / "README.md").read_text().split())
RAYSERVICE = find("RayService", "dlm")
GROUPS = {g["groupName"]: g for g in RAYSERVICE["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
[APP] = yaml.safe_load(RAYSERVICE["spec"]["serveConfigV2"])["applications"]
DEPLOYMENTS = {d["name"]: d for d in APP["deployments"]}
ENGINE = yaml.safe_load(find("ConfigMap", "dlm-config")["data"]["dlm.yaml"])["engine"]
GPU_MODELS = {"drafter": ("drafter", "drafter_bidirectional"), "guider": ("guider",), "ar": ("ar",)}


def stated(pattern: str, text: str = K8S_README) -> int:
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{pattern!r} found {len(found)} times"
    return int(found[0])


def most_replicas(deployment: str) -> int:
    options = DEPLOYMENTS.get(deployment, {})
    return options.get("autoscaling_config", {}).get("max_replicas", options.get("num_replicas", 1))


def served_models() -> list[str]:
    assert set(ENGINE["models"]) <= set(ROLES)
    return [name for name, roles in GPU_MODELS.items() if set(roles) & set(ENGINE["models"])]


def test_the_gpu_group_has_a_pod_per_model_replica_at_the_most():
    assert ENGINE["serving"]["num_gpus"] == 1
    need = sum(most_replicas(d) for d in served_models())
    gpu = GROUPS["gpu"]
    assert stated(r"one pod per model replica at the most: (\d+)") == need
    assert gpu["replicas"] == gpu["minReplicas"] == gpu["maxReplicas"] == need
    assert stated(r"set the group to (\d+) when the AR baseline is not served") == need - most_replicas("ar")


def test_the_drafter_bounds_and_routing_are_the_manifests():
    scaling = DEPLOYMENTS["drafter"]["autoscaling_config"]
    bounds = re.search(r"the drafter autoscales from (\d+) to (\d+) replicas", K8S_README)
    assert (int(bounds[1]), int(bounds[2])) == (scaling["min_replicas"], scaling["max_replicas"])
    assert "PinnedRouter" in K8S_README and "route()" not in K8S_README
    assert "k8s/rayservice.yaml` autoscales the drafter" in README


def test_every_service_name_the_docs_use_is_the_one_kuberay_creates():
    name = RAYSERVICE["metadata"]["name"]
    for text in (README, K8S_README):
        assert set(re.findall(r"svc/([\w<>.-]+-head-svc)", text)) == {f"{name}-head-svc"}
        assert set(re.findall(r"([\w<>.-]+-serve-svc)", text)) <= {f"{name}-serve-svc"}


def test_the_index_user_has_the_password_the_docs_name():
    args = find("Deployment", "dlm-redis")["spec"]["template"]["spec"]["containers"][0]["args"]
    users = " ".join(args).split("--user ")[1:]
    default = next(u for u in users if u.startswith("default "))
    assert ">$(INDEX_PASSWORD)" in default and "password-less" not in K8S_README
    assert "`default` user with the password from the Secret `dlm-redis` (key `index_password`" in K8S_README


def test_redis_keeps_its_data_on_the_claim_the_docs_name():
    pod = find("Deployment", "dlm-redis")["spec"]["template"]["spec"]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/data"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    assert find("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert f"PersistentVolumeClaim `{claim}`" in K8S_README


def images(node, under_containers: bool = False) -> list[str]:
    """Every image kustomize's image transformer rewrites: `image` fields of items under containers or
    initContainers, at any depth."""
    if isinstance(node, dict):
        found = [node["image"]] if under_containers and "image" in node else []
        for key, value in node.items():
            found += images(value, key in ("containers", "initContainers"))
        return found
    if isinstance(node, list):
        return [image for item in node for image in images(item, under_containers)]
    return []


def test_one_place_sets_the_image_of_the_ray_pods():
    [image] = kustomization()["images"]
    ray_pods = images(RAYSERVICE)
    assert ray_pods and set(ray_pods) == {image["name"]}  # named only, so kustomization.yaml alone says where it is
    everywhere = {i for _, doc in manifests() for i in images(doc)}
    assert everywhere - {image["name"]} == {"redis:7.2-alpine"}  # a public image, pinned where it is used
    assert image["newName"] not in (K8S_DIR / "rayservice.yaml").read_text()


def test_kustomize_applies_every_manifest_but_the_podmonitor():
    files = {name for name, _ in manifests()}
    assert set(kustomization()["resources"]) == files - {"podmonitor.yaml"}


def test_the_podmonitor_scrapes_the_port_the_policy_opens():
    monitor = find("PodMonitor", "dlm-ray")["spec"]
    assert monitor["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}  # KubeRay's label on its pods
    assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics"]
    policy = find("NetworkPolicy", "dlm-ray")["spec"]["ingress"]
    [rule] = [r for r in policy if any(p["port"] == 8080 for p in r.get("ports", []))]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert "`podmonitor.yaml` scrapes it" in K8S_README
