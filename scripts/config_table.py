"""Print the README's configuration table, generated from the settings object."""

from __future__ import annotations

from app.settings import Settings

__all__ = ["config_table"]


def config_table() -> str:
    """Markdown table of every ``AVCC_*`` variable with its default and description."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
        shown = "" if default is None else f"`{default}`"
        lines.append(f"| `AVCC_{name.upper()}` | {shown} | {field.description} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_table())
