"""The workers of the groups with local state, as their ``/ready`` says: ready, or recovering and
how far (a worker restoring its tables from their changelogs answers 503 with per-table progress).

A group's workers are the addresses of one host name (:meth:`ConsoleSettings.group_host`): in
Kubernetes the group's headless Service, whose DNS name resolves to every pod, recovering ones
included; on the local stack the one worker's address.
"""

from __future__ import annotations

import asyncio
import html
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from app.ops.console.settings import ConsoleSettings
from app.platform.groups import GROUPS, GroupSpec
from app.platform.settings import Settings

__all__ = ["WorkerReadiness", "group_workers", "workers_html"]

_e = html.escape


@dataclass(frozen=True, slots=True)
class WorkerReadiness:
    """What one worker's ``/ready`` answered (``status`` ``unreachable`` when nothing did)."""

    group: str
    url: str
    status: str
    reason: str = ""
    tables: Sequence[Mapping[str, Any]] = field(default_factory=tuple)

    @property
    def recovering(self) -> bool:
        """Whether the worker is restoring its tables."""
        return self.status == "recovering"


async def _addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a headless Service: one per pod)."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in found})


async def _readiness(session: aiohttp.ClientSession, group: str, url: str) -> WorkerReadiness:
    try:
        async with session.get(f"{url}/ready") as response:
            body = orjson.loads(await response.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
        return WorkerReadiness(group, url, "unreachable", type(exc).__name__)
    if not isinstance(body, dict):
        return WorkerReadiness(group, url, "unreachable", "not a readiness answer")
    return WorkerReadiness(
        group, url, str(body.get("status", "")), str(body.get("reason", "")), tuple(body.get("tables") or ())
    )


async def group_workers(
    settings: Settings, config: ConsoleSettings, groups: Iterable[GroupSpec] = GROUPS
) -> list[WorkerReadiness]:
    """The readiness of every worker of each group with local state among ``groups``."""
    targets: list[tuple[str, str]] = []
    for spec in groups:
        if not spec.local_state:
            continue
        port = settings.web_port + spec.port_offset
        for address in await _addresses(config.group_host(settings, spec.name), port):
            host = f"[{address}]" if ":" in address else address
            targets.append((spec.name, f"http://{host}:{port}"))
    timeout = aiohttp.ClientTimeout(total=config.peer_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        return list(await asyncio.gather(*(_readiness(session, group, url) for group, url in targets)))


def _progress(worker: WorkerReadiness) -> str:
    """``records 12,000 of 400,000 to go, ETA 4 s`` for each table being restored."""
    parts = []
    for table in worker.tables:
        remaining, total = int(table.get("remaining") or 0), int(table.get("total") or 0)
        if remaining:
            eta = table.get("eta_s")
            when = f", ETA {float(eta):.0f} s" if eta is not None else ""
            parts.append(f"{table.get('table')}: {remaining:,} of {total:,} records to go{when}")
    return "; ".join(parts) or worker.reason


def workers_html(workers: Sequence[WorkerReadiness]) -> str:
    """``<section id="workers">``: each worker of the groups with local state, a recovering one
    with how far its restore is."""
    rows = []
    for worker in workers:
        detail = _progress(worker) if worker.recovering else worker.reason
        rows.append(
            f'<tr data-group="{_e(worker.group)}" data-status="{_e(worker.status)}">'
            f"<td>{_e(worker.group)}</td><td>{_e(worker.url)}</td><td>{_e(worker.status)}</td>"
            f"<td>{_e(detail)}</td></tr>"
        )
    recovering = sorted({w.group for w in workers if w.recovering})
    summary = (
        f"<p class='flash' id='recovering'>Recovering: {_e(', '.join(recovering))}</p>" if recovering else ""
    )
    return (
        "<section id='workers'><h2>Workers with local state</h2>"
        + summary
        + "<table><thead><tr><th>group</th><th>worker</th><th>state</th><th>detail</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )
