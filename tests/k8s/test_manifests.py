import copy

import pytest

from tests.k8s.manifests import errors, find, manifests


@pytest.mark.parametrize("doc", [doc for _, doc in manifests()], ids=[f"{f}:{d['kind']}" for f, d in manifests()])
def test_manifest_validates_against_the_strict_schemas(doc):
    assert errors(doc) == []


def cluster(doc: dict) -> dict:
    return doc["spec"]["rayClusterConfig"]


def head_container(doc: dict) -> dict:
    return cluster(doc)["headGroupSpec"]["template"]["spec"]["containers"][0]


# Where a typo could hide: the RayService's own fields, KubeRay's nested options, a pod template inside the CRD (the
# Kubernetes schema, reached through a reference), and core kinds.
INJECTIONS = {
    "rayservice spec": (("RayService", "dlm"), lambda d: d["spec"]),
    "gcsFaultToleranceOptions": (("RayService", "dlm"), lambda d: cluster(d)["gcsFaultToleranceOptions"]),
    "worker group": (("RayService", "dlm"), lambda d: cluster(d)["workerGroupSpecs"][0]),
    "head container": (("RayService", "dlm"), head_container),
    "head securityContext": (("RayService", "dlm"), lambda d: head_container(d)["securityContext"]),
    "redis deployment pod": (("Deployment", "dlm-redis"), lambda d: d["spec"]["template"]["spec"]),
    "networkpolicy spec": (("NetworkPolicy", "dlm-ray"), lambda d: d["spec"]),
    "pdb spec": (("PodDisruptionBudget", "dlm-ray-head"), lambda d: d["spec"]),
    "redis volume claim": (("PersistentVolumeClaim", "dlm-redis-data"), lambda d: d["spec"]),
    "podmonitor endpoint": (("PodMonitor", "dlm-ray"), lambda d: d["spec"]["podMetricsEndpoints"][0]),
}


@pytest.mark.parametrize("where", INJECTIONS)
def test_an_unknown_field_fails_validation(where):
    (kind, name), target = INJECTIONS[where]
    doc = copy.deepcopy(find(kind, name))
    target(doc)["readinesProbe"] = {}
    found = errors(doc)
    assert found and any("readinesProbe" in e for e in found), found


def test_a_wrong_type_fails_validation():
    doc = copy.deepcopy(find("RayService", "dlm"))
    head_container(doc)["ports"][0]["containerPort"] = "six-three-seven-nine"
    assert errors(doc)


def test_an_unvendored_kind_is_an_error_not_a_pass():
    with pytest.raises(KeyError, match="no vendored schema"):
        errors({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "x"}})
