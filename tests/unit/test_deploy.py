"""Deploy artefacts: rendered from the topic plan and lag rules, current, and valid (promtool, YAML)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from app.ops.console.settings import ConsoleSettings
from app.ops.lag.settings import default_rules
from app.ops.slo.settings import SloSettings
from app.platform.groups import GROUPS
from app.platform.metrics import REGISTRY
from app.platform.settings import Settings
from app.platform.topics import APPLY_CREATED, PLAYBACK_EVENT

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
K8S = ROOT / "deploy" / "k8s"
#: The groups that keep local state in their data dir: each has a module in tables/ saying what.
STATEFUL = {path.stem for path in (ROOT / "tables").glob("*.py")} - {"__init__"}
#: Of those, the groups whose state is faust tables (restored from changelogs: standbys apply).
FAUST_TABLES = {
    group for group in STATEFUL if "model_table(" in (ROOT / "tables" / f"{group}.py").read_text()
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="module")
def render() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_render", ROOT / "deploy" / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if _in_ci():
            pytest.fail("promtool is missing on this CI machine (apt-get install prometheus)", pytrace=False)
        pytest.skip("promtool not installed")
    return found


def test_rendered_files_are_current(render: ModuleType) -> None:
    problems = render.check(ROOT)
    assert problems == [], f"stale deploy files, run `python deploy/render.py`: {problems}"


def test_keda_scaled_objects_follow_the_seed_and_the_partition_counts(render: ModuleType) -> None:
    objects: dict[str, dict[str, Any]] = render._scaled_objects(default_rules())
    summary = {
        group: (
            o["spec"]["maxReplicaCount"],
            o["spec"]["triggers"][0]["metadata"]["topic"],
            o["spec"]["triggers"][0]["metadata"]["lagThreshold"],
            o["spec"]["triggers"][0]["metadata"]["consumerGroup"],
            o["spec"]["scaleTargetRef"]["kind"],
            o["spec"]["scaleTargetRef"]["name"],
        )
        for group, o in objects.items()
    }
    assert summary == {
        "review": (
            APPLY_CREATED.partitions,
            APPLY_CREATED.name,
            "1000",
            "avcc-review",
            "StatefulSet",
            "avcc-review",
        ),
        "sink": (
            PLAYBACK_EVENT.partitions,
            PLAYBACK_EVENT.name,
            "50000",
            "avcc-sink",
            "Deployment",
            "avcc-sink",
        ),
        "anomaly": (
            PLAYBACK_EVENT.partitions,
            PLAYBACK_EVENT.name,
            "50000",
            "avcc-anomaly",
            "StatefulSet",
            "avcc-anomaly",
        ),
    }
    assert (APPLY_CREATED.partitions, PLAYBACK_EVENT.partitions) == (6, 24)


def test_one_workload_per_group_with_probes_on_the_worker_port(render: ModuleType) -> None:
    base = Settings.model_fields["web_port"].default
    for spec in GROUPS:
        workload = render._workload(spec)[0]
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert container["args"] == ["worker", spec.name]
        assert container["ports"] == [
            {"name": "web", "containerPort": base + spec.port_offset, "protocol": "TCP"}
        ]
        assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "web"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "web"}
        assert {"configMapRef": {"name": "avcc-config"}} in container["envFrom"]
        assert {"secretRef": {"name": "avcc-secrets"}} in container["envFrom"]
        assert {"secretRef": {"name": f"avcc-kafka-{spec.name}"}} in container["envFrom"]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
        assert (ROOT / "deploy" / "k8s" / render.workload_file(spec)).is_file()
    configmap = render._configmap(SloSettings())["data"]
    assert {"AVCC_KAFKA_URL", "AVCC_CLICKHOUSE_URL"} <= set(configmap)
    assert configmap["AVCC_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    secrets = {s["metadata"]["name"]: s["stringData"] for s in render._secret_examples()}
    assert "AVCC_HMAC_KEYS" in secrets["avcc-secrets"]
    for spec in GROUPS:  # each group its own principal, the one its ACLs are planned for
        assert secrets[f"avcc-kafka-{spec.name}"]["AVCC_KAFKA_SASL_USERNAME"] == f"avcc-{spec.name}"


def test_yaml_emitter_quotes_what_yaml_would_misread(render: ModuleType) -> None:
    text = render.to_yaml(
        {"a": "yes", "b": "6066", "c": "x: y", "d": [], "e": {}, "f": True, "g": "plain/ok-1"}
    )
    assert text == 'a: "yes"\nb: "6066"\nc: "x: y"\nd: []\ne: {}\nf: true\ng: plain/ok-1\n'


def test_k8s_manifests_parse_as_yaml() -> None:
    files = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
    assert files
    kinds = {f.name: [d["kind"] for d in yaml.safe_load_all(f.read_text())] for f in files}
    assert kinds["scaledobject-review.yaml"] == ["ScaledObject"]
    assert kinds["deployment-gateway.yaml"] == ["Deployment", "Service"]
    assert kinds["statefulset-code.yaml"] == ["StatefulSet", "Service", "PodDisruptionBudget", "Service"]
    assert kinds["statefulset-chain.yaml"] == ["StatefulSet", "Service", "PodDisruptionBudget"]
    workloads = sum(1 for k in kinds.values() for kind in k if kind in {"Deployment", "StatefulSet"})
    assert workloads == len(GROUPS) + 1  # and the ledger node
    kustomization = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        name for name in kinds if name not in {"kustomization.yaml", "secret.example.yaml"}
    )


def test_promtool_accepts_the_rules_and_the_config(promtool: str) -> None:
    for argv in (
        [promtool, "check", "rules", str(PROMETHEUS / "alerts.yml")],
        [promtool, "check", "config", str(PROMETHEUS / "prometheus.yml")],
    ):
        result = subprocess.run(argv, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_recorded_series_is_read_after_its_rule_in_the_same_group() -> None:
    """Prometheus evaluates the rules of a group in order but the groups independently (promtool's
    unit tests order them at random), so a rule reading a recorded series from another group, or
    from a later rule, judges a value one evaluation old and its promtool cases flake."""
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    recorded_in = {
        rule["record"]: group["name"] for group in groups for rule in group["rules"] if "record" in rule
    }
    assert recorded_in, "the rules record no series"
    for group in groups:
        seen: set[str] = set()
        for rule in group["rules"]:
            for name in set(re.findall(r"[a-z_]+:[a-z_:0-9]+", rule["expr"])) & set(recorded_in):
                assert recorded_in[name] == group["name"] and name in seen, (
                    f"{rule.get('alert') or rule.get('record')} reads {name} before its rule runs"
                )
            if "record" in rule:
                seen.add(rule["record"])


#: The hand-written promtool tests of the generated rules.
RULE_TESTS = sorted(PROMETHEUS.glob("*.test.yml"))


def test_promtool_rule_unit_tests_pass(promtool: str) -> None:
    assert [path.name for path in RULE_TESTS] == ["alerts.test.yml", "time_to_code.test.yml"]
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_generated_alert_has_a_firing_and_a_silent_promtool_case() -> None:
    """Each alert rule of alerts.yml (one per alert name and level) is expected to fire in some
    promtool case and to stay silent in another (an empty expectation, or one that lists other
    levels only)."""
    generated = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    alerts = {
        (rule["alert"], rule.get("labels", {}).get("level"))
        for group in generated
        for rule in group["rules"]
        if "alert" in rule
    }
    firing: set[tuple[str, str | None]] = set()
    silent: set[tuple[str, str | None]] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", ()):
                name = check["alertname"]
                levels = {alert["exp_labels"].get("level") for alert in check.get("exp_alerts") or ()}
                firing.update((name, level) for level in levels)
                silent.update((n, level) for n, level in alerts if n == name and level not in levels)
    assert alerts - firing == set(), "alerts no promtool case expects to fire"
    assert alerts - silent == set(), "alerts no promtool case expects to stay silent"
    assert len(alerts) == 12  # 5 lag, DLQ and producer alerts; 2 burn rates x 3 levels; the human wait


def _known_metric_names() -> set[str]:
    names: set[str] = set()
    for metric in REGISTRY.collect():
        names.add(metric.name)
        names.update(sample.name for sample in metric.samples)
        names.update(metric.name + suffix for suffix in ("_total", "_bucket", "_sum", "_count"))
    return names


def test_dashboard_and_alerts_only_use_metrics_the_workers_export() -> None:
    known = _known_metric_names()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "avcc.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs.append((PROMETHEUS / "alerts.yml").read_text())
    used = {m for expr in exprs for m in re.findall(r"\bavcc_[a-z_]+", expr)}
    assert used - known == set()
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("consumed", "latency", "lag", "dead letters"):
        assert topic in titles
    assert any("histogram_quantile" in e for e in exprs)


def test_dockerfile_one_non_root_image_for_all_groups() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "python:3.11-slim" in dockerfile
    assert re.search(r"^USER 10001", dockerfile, re.M)
    assert 'ENTRYPOINT ["avcc"]' in dockerfile
    assert 'CMD ["worker", "code"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "var", "deploy", "tests"):
        assert entry in ignored


#: Kinds whose schemas come with their operators' CRDs, not with Kubernetes: validated by shape in
#: the tests above (KEDA's ScaledObject and TriggerAuthentication, the Prometheus Operator's).
CRD_KINDS = {"ScaledObject", "TriggerAuthentication", "PodMonitor", "PrometheusRule"}


def test_k8s_manifests_pass_the_kubernetes_schemas() -> None:
    """Every built-in resource validates, strictly (no unknown field), against the newest
    Kubernetes schema kubernetes-validate ships."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    checked: list[str] = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":  # kustomize's input, not a resource
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document["kind"] in CRD_KINDS:
                continue
            kubernetes_validate.validate(document, version, strict=True)
            checked.append(f"{path.name}:{document['kind']}/{document['metadata']['name']}")
    print(f"{len(checked)} resources valid against Kubernetes {version}")
    workloads = [c for c in checked if ":Deployment/" in c or ":StatefulSet/avcc-" in c]
    assert len(workloads) == len(GROUPS) + 1  # and the ledger node
    assert len([c for c in checked if ":PodDisruptionBudget/" in c]) == len(STATEFUL)
    assert any(":Secret/avcc-kafka-code" in c for c in checked)


def test_a_scaled_chain_group_shares_one_ledger_node(render: ModuleType) -> None:
    """Every chain replica submits to the one ledger node (a StatefulSet of one replica on a
    volume), never to a ledger of its own: two ledgers would notarise a work twice."""
    env = render._workload(next(g for g in GROUPS if g.name == "chain"))[0]["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    url = next(e["value"] for e in env if e["name"] == "AVCC_CHAIN_URL")
    assert url == "ledger://avcc-ledger.avcc.svc:6075"
    assert any(e["name"] == "AVCC_CHAIN_NODE_TOKEN" and "secretKeyRef" in e["valueFrom"] for e in env)
    statefulset, service = render._ledger_node()
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert service["spec"]["ports"][0]["port"] == 6075
    for spec in GROUPS:
        if spec.name != "chain":
            other = render._workload(spec)[0]["spec"]["template"]["spec"]["containers"][0]["env"]
            assert all(e["name"] != "AVCC_CHAIN_URL" for e in other)


def _resources() -> dict[tuple[str, str], dict[str, Any]]:
    """Every rendered Kubernetes resource, by kind and name."""
    resources: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for document in yaml.safe_load_all(path.read_text()):
                resources[(document["kind"], document["metadata"]["name"])] = document
    return resources


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_groups_with_local_state_run_as_statefulsets_on_their_own_volumes(render: ModuleType) -> None:
    """A restart, roll or drain finds the worker's stores on its volume (it replays the tail of
    its changelogs, not all of them), and peers reach each worker at its stable DNS name."""
    assert {"code", "review", "chain", "settlement", "anomaly", "ops"} == STATEFUL  # as issue 35 lists
    assert {spec.name for spec in GROUPS if spec.local_state} == STATEFUL == set(render.DATA_VOLUMES)
    assert {"code", "review", "chain", "settlement"} == FAUST_TABLES
    resources = _resources()
    data_dir = resources[("ConfigMap", "avcc-config")]["data"]["AVCC_DATA_DIR"]
    budgets = [r["spec"] for (kind, _), r in resources.items() if kind == "PodDisruptionBudget"]
    for spec in GROUPS:
        name = f"avcc-{spec.name}"
        if spec.name not in STATEFUL:
            assert ("Deployment", name) in resources and ("StatefulSet", name) not in resources
            continue
        assert ("Deployment", name) not in resources, f"{spec.name} keeps local state: not a Deployment"
        statefulset = resources[("StatefulSet", name)]
        sts = statefulset["spec"]
        pod = sts["template"]["spec"]
        container = pod["containers"][0]
        assert (sts["podManagementPolicy"], sts["updateStrategy"]["type"]) == ("Parallel", "RollingUpdate")
        mount = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == data_dir)
        claims = {c["metadata"]["name"]: c["spec"] for c in sts.get("volumeClaimTemplates", [])}
        assert mount in claims, f"{spec.name}: its data dir is not on a volumeClaimTemplate"
        assert all(v["name"] != mount for v in pod["volumes"])
        assert claims[mount]["accessModes"] == ["ReadWriteOnce"]
        assert claims[mount]["resources"]["requests"]["storage"].endswith("Gi")
        labels = sts["selector"]["matchLabels"]
        assert sts["template"]["metadata"]["labels"] == labels
        peers = resources.get(("Service", sts["serviceName"]), {}).get("spec", {})
        assert peers.get("clusterIP") == "None", f"{spec.name}: no headless Service {sts['serviceName']}"
        assert peers["publishNotReadyAddresses"] is True and peers["selector"] == labels
        assert [b["maxUnavailable"] for b in budgets if b["selector"]["matchLabels"] == labels] == [1]
        env = _env(container)
        names = [e["name"] for e in container["env"]]
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert names.index("POD_NAME") < names.index("AVCC_WEB_ADVERTISED_URL")  # $(POD_NAME) expands
        pod_name, port = f"{name}-0", container["ports"][0]["containerPort"]
        url = env["AVCC_WEB_ADVERTISED_URL"].replace("$(POD_NAME)", pod_name)
        namespace = statefulset["metadata"]["namespace"]
        assert Settings(web_advertised_url=url).advertised_url(port) == (
            f"http://{pod_name}.{sts['serviceName']}.{namespace}.svc:{port}"
        )
        assert env["AVCC_KAFKA_GROUP_INSTANCE_ID"] == "$(POD_NAME)"
        console = ConsoleSettings(
            workers_host=resources[("ConfigMap", "avcc-config")]["data"]["AVCC_CONSOLE_WORKERS_HOST"]
        )
        assert console.group_host(Settings(), spec.name) == f"{sts['serviceName']}.{namespace}.svc"
        assert env.get("AVCC_TABLE_STANDBY_REPLICAS") == ("1" if spec.name in FAUST_TABLES else None)
        # a standby copy needs another replica to live on, preferably on another node
        assert sts["replicas"] == (2 if spec.name in FAUST_TABLES else 1)
        spread = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert spread[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == labels
        startup = container["startupProbe"]
        assert startup["httpGet"]["path"] == "/ready"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # a cold rebuild: ~30 s


def test_every_worker_stops_within_its_grace_period() -> None:
    """The worker exits on its own within AVCC_WORKER_STOP_S of SIGTERM (within 10 s, its broker
    gone or not); the kubelet waits longer before it kills."""
    for (kind, name), resource in _resources().items():
        if kind in {"Deployment", "StatefulSet"} and name != "avcc-ledger":
            pod = resource["spec"]["template"]["spec"]
            stop = float(_env(pod["containers"][0])["AVCC_WORKER_STOP_S"])
            assert stop <= 10, name
            assert pod["terminationGracePeriodSeconds"] > stop, name


def test_keda_scales_the_workload_of_each_group() -> None:
    resources = _resources()
    for (kind, name), resource in resources.items():
        if kind == "ScaledObject":
            target = resource["spec"]["scaleTargetRef"]
            assert (target["kind"], target["name"]) in resources, name
            workload = resources[(target["kind"], target["name"])]["spec"]
            assert resource["spec"]["minReplicaCount"] == workload["replicas"], name
