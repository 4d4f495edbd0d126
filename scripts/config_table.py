"""Print the README's configuration tables, generated from the settings classes."""

from __future__ import annotations

import importlib
import sys

from pydantic_settings import BaseSettings

__all__ = ["SETTINGS_CLASSES", "config_tables"]

#: Every settings class, in README order: (module, class name, heading).
SETTINGS_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("app.platform.settings", "Settings", "Pipeline (all groups)"),
    ("app.lifecycle.review.settings", "ReviewSettings", "review rules (review group)"),
    ("app.lifecycle.code.settings", "BulkSettings", "bulk applications (code group)"),
    ("app.playback.gateway.settings", "GatewaySettings", "gateway group"),
    ("app.playback.sink.settings", "SinkSettings", "sink group"),
    ("app.playback.anomaly.settings", "AnomalyRuleSettings", "anomaly rules (anomaly group)"),
    ("app.playback.anomaly.settings", "AnomalySettings", "anomaly detector (anomaly group)"),
    ("app.platform.lag.settings", "LagReadSettings", "lag reading (every worker, the lag monitor)"),
    ("app.ops.lag.settings", "LagSettings", "lag monitor (ops group)"),
    ("app.ops.console.settings", "ConsoleSettings", "console overview and review workbench (ops group)"),
    ("app.ops.slo.settings", "SloSettings", "time-to-code service levels (console, alert rules)"),
    ("app.supervisor.settings", "SupervisorSettings", "dev stack supervisor (`avcc dev`)"),
    ("app.servers.settings", "EmbeddedKafkaSettings", "embedded Apache Kafka (`avcc dev`, tests, benches)"),
)


def _table(cls: type[BaseSettings], heading: str) -> str:
    prefix = str(cls.model_config.get("env_prefix", ""))
    lines = [f"#### {heading}", "", "| variable | default | meaning |", "|---|---|---|"]
    for name, field in cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "" if default is None else f"`{default}`".replace("|", "\\|")
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{prefix}{name.upper()}` | {shown} | {description} |")
    return "\n".join(lines)


def config_tables() -> str:
    """Markdown tables of every ``AVCC_*`` variable with its default and meaning."""
    parts = []
    for module, name, heading in SETTINGS_CLASSES:
        cls = getattr(importlib.import_module(module), name)
        parts.append(_table(cls, heading))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(config_tables())
