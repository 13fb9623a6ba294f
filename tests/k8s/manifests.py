"""The manifests in k8s/ and their offline validation against the vendored strict schemas (k8s/schemas/): the
Kubernetes JSON schemas for core kinds, the KubeRay RayService schema and the Prometheus operator's PodMonitor, all
rejecting unknown fields."""

import json
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

K8S_DIR = Path(__file__).resolve().parents[2] / "k8s"
SCHEMAS = K8S_DIR / "schemas"
KUBERNETES = json.loads((SCHEMAS / "kubernetes-v1.33.0-strict.json").read_text())
RAYSERVICE = json.loads((SCHEMAS / "kuberay-rayservice-v1.json").read_text())
PODMONITOR = json.loads((SCHEMAS / "prometheus-operator-podmonitor-v1.json").read_text())
CUSTOM = {("ray.io/v1", "RayService"): RAYSERVICE, ("monitoring.coreos.com/v1", "PodMonitor"): PODMONITOR}
REGISTRY = Registry().with_resources(
    (schema["$id"], Resource.from_contents(schema)) for schema in (KUBERNETES, *CUSTOM.values())
)
KUSTOMIZATION = K8S_DIR / "kustomization.yaml"


def manifests() -> list[tuple[str, dict]]:
    """(file name, document) for every Kubernetes object in k8s/ (kustomization.yaml is kustomize's, not one)."""
    return [
        (path.name, doc)
        for path in sorted(K8S_DIR.glob("*.yaml"))
        if path != KUSTOMIZATION
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def kustomization() -> dict:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def find(kind: str, name: str) -> dict:
    return next(doc for _, doc in manifests() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def schema_for(doc: dict) -> dict:
    custom = CUSTOM.get((doc.get("apiVersion"), doc.get("kind")))
    if custom is not None:
        return custom
    group, _, version = doc.get("apiVersion", "").rpartition("/")
    gvk = {"group": group, "version": version, "kind": doc.get("kind")}
    for name, definition in KUBERNETES["$defs"].items():
        if gvk in definition.get("x-kubernetes-group-version-kind", []):
            return {"$ref": f"{KUBERNETES['$id']}#/$defs/{name}"}
    raise KeyError(f"no vendored schema for {doc.get('apiVersion')} {doc.get('kind')}: add it to k8s/schemas/vendor.py")


def errors(doc: dict) -> list[str]:
    """Every schema violation of one manifest, as `path: message`; empty when it validates."""
    validator = Draft202012Validator(schema_for(doc), registry=REGISTRY)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]
