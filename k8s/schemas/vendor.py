"""Writes kubernetes-<version>-strict.json: the strict Kubernetes JSON schemas that the manifests in k8s/ use, cut
from the `kubernetes-validate` wheel (its kubernetes-json-schema/v<version>-local-strict/_definitions.json).

    pip download --no-deps kubernetes-validate==1.37.0 -d /tmp/kv && unzip -q /tmp/kv/*.whl -d /tmp/kv
    python k8s/schemas/vendor.py /tmp/kv/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict

Keeps the definitions reachable from ROOTS (the kinds in k8s/*.yaml and the core types kuberay-v1.json refers to)
and drops their descriptions; nothing else is changed."""

import json
import sys
from pathlib import Path

ROOTS = [
    "io.k8s.api.core.v1.Namespace",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.PersistentVolumeClaim",
    "io.k8s.api.core.v1.Service",
    "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.networking.v1.NetworkPolicy",
    "io.k8s.api.policy.v1.PodDisruptionBudget",
    # referred to by kuberay-v1.json
    "io.k8s.api.core.v1.PodTemplateSpec",
    "io.k8s.api.core.v1.EnvVarSource",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.EnvFromSource",
    "io.k8s.api.core.v1.VolumeMount",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.SecurityContext",
    "io.k8s.api.networking.v1.NetworkPolicyIngressRule",
    "io.k8s.api.networking.v1.NetworkPolicyEgressRule",
    "io.k8s.api.networking.v1.IngressTLS",
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "io.k8s.apimachinery.pkg.api.resource.Quantity",
]
PREFIX = "#/$defs/"  # references inside _definitions.json are local


def refs(node) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].removeprefix(PREFIX)} if "$ref" in node else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def strip_descriptions(node):
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(schema_dir: str) -> None:
    source = json.loads((Path(schema_dir) / "_definitions.json").read_text())
    keep, todo = set(), list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep.add(name)
            todo.extend(refs(source["$defs"][name]) - keep)
    version = Path(schema_dir).name.removesuffix("-local-strict")
    out = {**source, "$defs": {name: strip_descriptions(source["$defs"][name]) for name in sorted(keep)}}
    target = Path(__file__).parent / f"kubernetes-{version}-strict.json"
    target.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"{target}: {len(keep)} of {len(source['$defs'])} definitions")


if __name__ == "__main__":
    main(sys.argv[1])
