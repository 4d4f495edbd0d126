"""The command-line reference: every ``avcc`` command with its usage, help and options, read
from the click commands themselves."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

from app.cli import main
from scripts.docgen.schema_md import cell, docstring_text

__all__ = ["cli_reference"]


_Path = tuple[str, ...]


def _commands(command: click.Command, path: _Path) -> Iterator[tuple[_Path, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from _commands(command.commands[name], (*path, name))


def _usage(command: click.Command, path: tuple[str, ...]) -> str:
    ctx = click.Context(command, info_name=" ".join(path))
    return " ".join([" ".join(path), *command.collect_usage_pieces(ctx)])


def _options(command: click.Command) -> str:
    rows = ["| option | meaning | default |", "|---|---|---|"]
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        names = ", ".join(f"`{o}`" for o in param.opts)
        shown = param.default not in (None, "") and not (param.is_flag or param.required)
        default = f"`{param.default}`" if shown else ""
        if isinstance(param.type, click.Choice):
            default += f" (one of {', '.join(f'`{c}`' for c in param.type.choices)})"
        required = " (required)" if param.required else ""
        rows.append(f"| {names} | {cell(param.help or '')}{required} | {default} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def cli_reference() -> str:
    """A section per command, groups before their subcommands, in alphabetical order."""
    parts = []
    for path, command in _commands(main, ("avcc",)):
        if len(path) == 1:
            continue
        level = "#" * min(len(path) + 1, 4)
        help_text = docstring_text(inspect.cleandoc(command.help or ""))
        block = [f"{level} `{' '.join(path)}`", f"```\n{_usage(command, path)}\n```", help_text]
        block.append(_options(command))
        parts.append("\n\n".join(b for b in block if b))
    return "\n\n".join(parts)
