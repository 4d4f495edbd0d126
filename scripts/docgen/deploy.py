"""The Kubernetes reference: what ``deploy/k8s`` (rendered by ``deploy/render.py``) holds, read
from the manifests themselves."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from scripts.docgen.blocks import ROOT

__all__ = ["manifest_table", "workload_table"]

K8S = ROOT / "deploy" / "k8s"
_WORKLOADS = ("Deployment", "StatefulSet")


def _documents(name: str) -> Iterator[Mapping[str, Any]]:
    for document in yaml.safe_load_all((K8S / name).read_text()):
        if document:
            yield document


def _files() -> list[str]:
    kustomization = next(_documents("kustomization.yaml"))
    return [str(name) for name in kustomization["resources"]]


def manifest_table() -> str:
    """Every file the kustomization applies, in its order, with the resources it holds; then the
    example Secrets it expects."""
    rows = ["| file | resources |", "|---|---|"]
    for name in [*_files(), "secret.example.yaml"]:
        kinds = ", ".join(f"{d['kind']} `{d['metadata'].get('name', '')}`" for d in _documents(name))
        rows.append(f"| `{name}` | {kinds} |")
    return "\n".join(rows)


def _scaling() -> dict[str, str]:
    found = {}
    for name in _files():
        for document in _documents(name):
            if document["kind"] == "ScaledObject":
                spec = document["spec"]
                target = spec["scaleTargetRef"]["name"]
                found[target] = f"KEDA {spec['minReplicaCount']} to {spec['maxReplicaCount']}"
    return found


def workload_table() -> str:
    """One row per workload: kind, replicas, autoscaling, volume, resources."""
    scaling = _scaling()
    rows = [
        "| workload | kind | replicas | autoscaling | volume | requests | limits |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in _files():
        for document in _documents(name):
            if document["kind"] not in _WORKLOADS:
                continue
            spec = document["spec"]
            container = spec["template"]["spec"]["containers"][0]
            resources = container.get("resources", {})
            volumes = [
                t["spec"]["resources"]["requests"]["storage"] for t in spec.get("volumeClaimTemplates", ())
            ]
            workload = document["metadata"]["name"]

            def amount(kind: str, resources: Mapping[str, Any] = resources) -> str:
                values = resources.get(kind, {})
                return f"{values.get('cpu', '?')} CPU, {values.get('memory', '?')}"

            rows.append(
                f"| `{workload}` | {document['kind']} | {spec.get('replicas', 1)} "
                f"| {scaling.get(workload, '—')} | {', '.join(volumes) or '—'} "
                f"| {amount('requests')} | {amount('limits')} |"
            )
    return "\n".join(rows)
