"""The alerts reference: every alerting rule of ``deploy/prometheus/alerts.yml`` (itself rendered
from the settings by ``deploy/render.py``) with its severity, condition and what it asks of an
operator; the rules one alert has per level or per topic are shown together."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from scripts.docgen.blocks import ROOT
from scripts.docgen.schema_md import cell

__all__ = ["alerts"]

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


def _rules() -> dict[str, list[Mapping[str, Any]]]:
    document = yaml.safe_load(ALERTS.read_text())
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                by_name.setdefault(rule["alert"], []).append(rule)
    return by_name


def _distinct(rules: list[Mapping[str, Any]], key: str) -> list[str]:
    seen: list[str] = []
    for rule in rules:
        value = str(rule["annotations"].get(key, ""))
        if value and value not in seen:
            seen.append(value)
    return seen


def alerts() -> str:
    """A summary table, then a section per alert: when it fires and what to do."""
    by_name = _rules()
    rows = ["| alert | severity | summary |", "|---|---|---|"]
    sections = []
    for name, rules in by_name.items():
        severities = sorted({str(r["labels"].get("severity", "")) for r in rules})
        summaries = _distinct(rules, "summary")
        rows.append(f"| [{name}](#{name.lower()}) | {', '.join(severities)} | {cell(summaries[0])} |")
        parts = [f"### {name}", f"Severity {', '.join(severities)}."]
        if len(summaries) > 1:
            parts.append("\n".join(f"- {cell(s)}" for s in summaries))
        else:
            parts.append(cell(summaries[0]) + ".")
        parts.append("**What to do**: " + " ".join(cell(r) for r in _distinct(rules, "recommendation")))
        condition = []
        for rule in rules:
            held = f"  # for {rule['for']}" if rule.get("for") else ""
            condition.append(f"{rule['expr']}{held}")
        parts.append("Fires when:\n\n```\n" + "\n".join(dict.fromkeys(condition)) + "\n```")
        sections.append("\n\n".join(parts))
    return "\n\n".join(["\n".join(rows), *sections])
