"""Generated documentation: every part of the README and of the site that is read from the code.

``python -m scripts.docgen`` rewrites the stale blocks; ``--check`` lists them and exits 1 (the
unit tests do the same, one test per block). Each block is a renderer of public objects (the
topic plan, the groups, the settings classes, the click commands, the OpenAPI and AsyncAPI
documents, the alert rules, the metrics registry, the exit constants), so a page follows the code
it describes.
"""

from __future__ import annotations

from scripts.config_table import config_tables
from scripts.docgen import alerts, benches, cli_ref, deploy, events, exits, http_api, metrics, topology
from scripts.docgen.blocks import Block

__all__ = ["BLOCKS"]

BLOCKS: tuple[Block, ...] = (
    Block("README.md", "flow", topology.flow_diagram),
    Block("docs/index.md", "flow", topology.flow_diagram),
    Block("docs/architecture.md", "flow", topology.flow_diagram),
    Block("docs/architecture.md", "system", topology.system_diagram),
    Block("docs/architecture.md", "groups", topology.group_table),
    Block("docs/architecture.md", "topics", topology.topic_table),
    Block("docs/architecture.md", "state-topics", topology.state_topic_table),
    Block("docs/reference/http-api.md", "http-api", http_api.http_api),
    Block("docs/reference/events.md", "events", events.events),
    Block("docs/reference/configuration.md", "configuration", config_tables),
    Block("docs/reference/cli.md", "cli", cli_ref.cli_reference),
    Block("docs/reference/metrics.md", "metrics", metrics.metrics),
    Block("docs/operations/kubernetes.md", "manifests", deploy.manifest_table),
    Block("docs/operations/kubernetes.md", "workloads", deploy.workload_table),
    Block("docs/operations/scaling.md", "scaling", topology.scaling_table),
    Block("docs/troubleshooting/exit-statuses.md", "exit-statuses", exits.exit_table),
    Block("docs/troubleshooting/alerts.md", "alerts", alerts.alerts),
    Block("docs/benchmarks.md", "benches", benches.benches),
)
