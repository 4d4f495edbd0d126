"""Command-line options more than one bench takes, so each is spelled and read in one place."""

from __future__ import annotations

import argparse

__all__ = ["add_worker_env", "worker_env"]


def add_worker_env(parser: argparse.ArgumentParser) -> None:
    """``--worker-env AVCC_NAME=VALUE`` (repeatable): a setting for every worker the bench starts,
    to compare configurations."""
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="AVCC_NAME=VALUE",
        help="a setting for every worker (repeatable), to compare configurations",
    )


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """The ``--worker-env`` settings as an environment (a later name wins)."""
    return dict(item.split("=", 1) for item in args.worker_env)
