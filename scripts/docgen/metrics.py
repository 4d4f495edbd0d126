"""The metrics reference: every family a worker serves on ``/metrics``, read from the registry
the workers use once every group's modules are loaded."""

from __future__ import annotations

import sys

from prometheus_client.metrics import MetricWrapperBase

from app.platform.groups import GROUPS
from app.platform.internal_topics import group_app
from app.platform.metrics import REGISTRY
from scripts.docgen.schema_md import cell

__all__ = ["metrics"]

_PACKAGES = ("app", "agents", "tables")


def _label_names() -> dict[str, tuple[str, ...]]:
    """Family name -> label names of every metric object the product's modules hold. The client
    library keeps label names only on the object (and a collector's family), not in what the
    registry collects, so they are read from there; sample labels would depend on what the
    process observed."""
    found: dict[str, tuple[str, ...]] = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] not in _PACKAGES or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, MetricWrapperBase):
                for family in value.describe():
                    found[family.name] = tuple(getattr(value, "_labelnames", ()))
    return found


def metrics() -> str:
    """A table of every metric family: name as scraped, type, labels, meaning."""
    for group in GROUPS:
        group_app(group)
    labels = _label_names()
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    families = sorted(REGISTRY.collect(), key=lambda f: f.name)
    for family in families:
        name = f"{family.name}_total" if family.type == "counter" else family.name
        names = labels.get(family.name, getattr(family, "_labelnames", ()))
        shown = ", ".join(f"`{n}`" for n in names) or "—"
        rows.append(f"| `{name}` | {family.type} | {shown} | {cell(family.documentation)} |")
    return "\n".join(rows)
