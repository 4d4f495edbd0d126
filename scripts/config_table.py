"""The configuration reference's tables (``docs/reference/configuration.md``), generated from the
settings classes: every ``AVCC_*`` variable with its default, as the environment takes it, and meaning."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from pydantic import TypeAdapter
from pydantic_settings import BaseSettings

__all__ = ["SETTINGS_CLASSES", "config_tables"]

#: Every settings class, in the page's order: (module, class name, heading).
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


def _shown(default: Any, annotation: Any) -> str:
    """A default as the variable would be set: text as is, anything else as JSON (how the
    settings read lists, mappings and rules from the environment)."""
    if default is None:
        return ""
    if default == "":
        return "(empty)"
    text = default if isinstance(default, str) else TypeAdapter(annotation).dump_json(default).decode()
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def _table(cls: type[BaseSettings], heading: str) -> str:
    prefix = str(cls.model_config.get("env_prefix", ""))
    lines = [f"## {heading}", "", "| variable | default | meaning |", "|---|---|---|"]
    for name, field in cls.model_fields.items():
        shown = _shown(field.get_default(call_default_factory=True), field.annotation)
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
