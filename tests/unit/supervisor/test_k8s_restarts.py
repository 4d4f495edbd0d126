"""Kubernetes is the supervisor outside dev: every worker pod is restarted when its process dies
(an abort inside librdkafka included) or hangs, which is what makes such a crash survivable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from app.platform.groups import GROUPS

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"


def _pod_spec(group: str) -> dict[str, Any]:
    """The pod of ``group``'s Deployment or StatefulSet (``deployment-<group>.yaml`` or
    ``statefulset-<group>.yaml``)."""
    (workload,) = [
        d
        for path in K8S.glob(f"*-{group}.yaml")
        for d in yaml.safe_load_all(path.read_text())
        if d["kind"] in {"Deployment", "StatefulSet"}
    ]
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def test_every_worker_pod_is_restarted_when_its_process_exits_or_hangs() -> None:
    for group in GROUPS:
        pod = _pod_spec(group.name)
        # a Deployment's or StatefulSet's pods only allow Always (the default): any exit, a signal
        # included, restarts
        assert pod.get("restartPolicy", "Always") == "Always", group.name
        (container,) = pod["containers"]
        assert container["args"] == ["worker", group.name], "the worker must be the container's process"
        live = container["livenessProbe"]
        assert live["httpGet"]["path"] == "/health", group.name
        hung_for = live["periodSeconds"] * live["failureThreshold"]
        assert hung_for <= 120, f"{group.name}: a hung worker is only restarted after {hung_for}s"
