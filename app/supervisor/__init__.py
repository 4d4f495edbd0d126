"""Supervision of the local dev stack (``avcc dev``).

Modules:

* ``backoff``  — the pure restart policy: exponential delays, reset after a stable run.
* ``ports``    — the port plan and its preflight: fail fast naming a port planned twice, or a taken
  port and, if visible, its holder.
* ``groups``   — one worker process per agent group, restarted with backoff, never stopping the rest.
* ``broker``   — the embedded Kafka broker, restarted with the same backoff on its own data.
* ``broker_identity`` — the broker's cluster id recorded beside the workers' tables, checked at start.
* ``settings`` — ``AVCC_DEV_RESTART_*`` knobs of the backoff.
"""

from __future__ import annotations

from app.supervisor.backoff import BackoffPolicy, RestartTracker
from app.supervisor.broker import BrokerSupervisor
from app.supervisor.broker_identity import TablesFromAnotherBroker, check_tables_belong_to
from app.supervisor.groups import GroupSupervisor, describe_exit
from app.supervisor.ports import (
    PortClaim,
    PortInUse,
    PortPlan,
    PortPlanConflict,
    port_holders,
    require_free_ports,
)
from app.supervisor.settings import SupervisorSettings

__all__ = [
    "BackoffPolicy",
    "BrokerSupervisor",
    "GroupSupervisor",
    "PortClaim",
    "PortInUse",
    "PortPlan",
    "PortPlanConflict",
    "RestartTracker",
    "SupervisorSettings",
    "TablesFromAnotherBroker",
    "check_tables_belong_to",
    "describe_exit",
    "port_holders",
    "require_free_ports",
]
