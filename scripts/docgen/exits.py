"""Exit statuses: every status a worker, ``avcc dev`` or another ``avcc`` command ends with.

Two halves that a unit test holds together:

* the code's: :func:`exit_constants` finds every module-level ``*EXIT*`` integer constant in the
  product packages with the ``#:`` comment above it (what the status means, in the words of the
  code that raises it); :func:`raised_statuses` finds every status passed to ``SystemExit``,
  ``sys.exit`` or ``os._exit`` (a message instead of a number is status 1);
* the operator's: :data:`STATUSES`, what to do about each, keyed by status and process, naming
  the constant whose comment gives the meaning.

The troubleshooting page's table is rendered from both (:func:`exit_table`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from scripts.docgen.blocks import ROOT
from scripts.docgen.schema_md import cell

__all__ = ["STATUSES", "ExitConstant", "ExitStatus", "exit_constants", "exit_table", "raised_statuses"]

#: The packages of the product (what a worker or ``avcc`` runs).
PACKAGES = ("app", "agents", "tables")
_EXIT_NAME = re.compile(r"^(?:[A-Z0-9]+_)*EXIT(?:_[A-Z0-9]+)*$")
_EXIT_CALLS = {"SystemExit", "sys.exit", "os._exit", "exit"}


@dataclass(frozen=True, slots=True)
class ExitConstant:
    """A named exit status in the code, with the ``#:`` comment that documents it."""

    name: str
    status: int
    doc: str
    where: str


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """One row of the table: a status, the process that ends with it, what it means, what to do."""

    status: int
    process: str
    action: str
    #: The constant whose comment says what the status means (``None``: :attr:`meaning` says it).
    constant: str | None = None
    meaning: str = ""


def _modules(packages: Iterable[str]) -> Iterator[tuple[Path, ast.Module, list[str]]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            yield path, ast.parse(text), text.splitlines()


def _numbers(tree: ast.Module) -> dict[str, int | float]:
    found: dict[str, int | float] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        number = isinstance(value, ast.Constant) and type(value.value) in (int, float)
        if isinstance(target, ast.Name) and number and value is not None:
            found[target.id] = value.value
    return found


def _comment_above(lines: list[str], lineno: int) -> str:
    doc: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        doc.insert(0, lines[index].strip().removeprefix("#:").strip())
        index -= 1
    return " ".join(doc)


def _resolve_refs(doc: str, numbers: dict[str, int | float]) -> str:
    """``:data:`NAME``` as ``NAME (value s)`` for a number of the module (they are timeouts)."""

    def shown(match: re.Match[str]) -> str:
        name = match[1]
        return f"{name} ({numbers[name]:g} s)" if name in numbers else name

    return re.sub(r":data:`~?(\w+)`", shown, doc)


def exit_constants(packages: Iterable[str] = PACKAGES) -> list[ExitConstant]:
    """Every module-level integer constant named ``EXIT_*`` or ``*_EXIT_*`` with its comment; a
    ``:data:`NAME``` in the comment naming a number of the same module shows that number."""
    found = []
    for path, tree, lines in _modules(packages):
        numbers = _numbers(tree)
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if not (isinstance(target, ast.Name) and _EXIT_NAME.match(target.id)):
                continue
            if target.id not in numbers or not isinstance(numbers[target.id], int):
                continue
            doc = _resolve_refs(_comment_above(lines, node.lineno), numbers)
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            found.append(ExitConstant(target.id, int(numbers[target.id]), doc, where))
    return found


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return ""


def _status_of(arg: ast.expr, constants: dict[str, int]) -> int | None:
    if isinstance(arg, ast.Constant):
        return arg.value if isinstance(arg.value, int) else 1
    if isinstance(arg, ast.JoinedStr):
        return 1
    name = arg.id if isinstance(arg, ast.Name) else arg.attr if isinstance(arg, ast.Attribute) else ""
    return constants.get(name)


def raised_statuses(packages: Iterable[str] = PACKAGES) -> dict[int, list[str]]:
    """status -> where the code ends a process with it: the literal or named statuses given to
    ``SystemExit``, ``sys.exit`` or ``os._exit``, and every named exit constant."""
    constants = {c.name: c.status for c in exit_constants(packages)}
    found: dict[int, list[str]] = {}
    for constant in exit_constants(packages):
        found.setdefault(constant.status, []).append(constant.where)
    for path, tree, _ in _modules(packages):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and _call_name(node.func) in _EXIT_CALLS):
                continue
            status = _status_of(node.args[0], constants) if node.args else 0
            if status is not None:
                found.setdefault(status, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


#: What an operator does about each status. A worker is run by a supervisor (``avcc dev``, or
#: Kubernetes) that starts it again after any exit, except where the row says otherwise.
STATUSES: tuple[ExitStatus, ...] = (
    ExitStatus(
        0,
        "any",
        "Nothing.",
        meaning="It stopped because it was asked to (SIGTERM, Ctrl-C), or the command did its work.",
    ),
    ExitStatus(
        1,
        "worker",
        "Read the last ERROR and CRITICAL lines of its log: they name the exception. A worker "
        "that prints `drift:` lines before it stops found its changelog topics unlike its tables "
        "(partitions, cleanup policy): `avcc topics apply` shows and fixes what it can. Anything "
        "else is a bug to report with the log; the supervisor restarts the worker meanwhile.",
        meaning="It crashed (an exception nothing handled), or its changelog topics drift from its "
        "tables; also a worker that did not stop within `AVCC_WORKER_STOP_S` after crashing.",
    ),
    ExitStatus(
        1,
        "avcc dev",
        "Read the broker's log in the data dir (`var/kafka`) for why it did not start; with "
        "`--no-broker`, check that `AVCC_KAFKA_URL` answers. A message about unknown groups "
        "names the groups `--groups` may take.",
        constant="EXIT_BROKER_LOST",
    ),
    ExitStatus(
        1,
        "other commands",
        "Read what it printed: drift left alone (`avcc topics apply`), a backward-incompatible "
        "contract (`avcc contracts check`), an invalid event (`avcc validate`), a ClickHouse table "
        "of another schema (`avcc clickhouse apply`), a ledger or registration that does not "
        "verify (`avcc chain verify`), a failed request (`avcc client`, `avcc dlq`, `avcc lag`), "
        "a backup that cannot be restored where asked (`avcc backup`).",
        meaning="The command ran and found something wrong, or could not do its work.",
    ),
    ExitStatus(
        2,
        "avcc dev",
        "The message names the port, what it is for and, when it can tell, the process holding "
        "it: stop that process, or move the stack with `AVCC_WEB_PORT` (and `AVCC_KAFKA_URL` for "
        "the broker's port).",
        constant="EXIT_PORT_IN_USE",
    ),
    ExitStatus(
        2,
        "other commands",
        "Run the command with `--help`; the message names the option, group or topic it did not know.",
        meaning="A usage error: an unknown option, group or topic, a missing argument.",
    ),
    ExitStatus(
        3,
        "avcc dev",
        "Delete `var/workers` (every table is rebuilt from the broker's changelogs) or run "
        "`make clean` for a fresh stack.",
        constant="EXIT_TABLES_FROM_ANOTHER_BROKER",
    ),
    ExitStatus(
        65,
        "worker",
        "The broker's data was deleted or replaced while the worker's data dir was kept, and no "
        "restart mends that: delete the worker's data dir (its tables are rebuilt from the "
        "changelogs): in Kubernetes its PVC `data-avcc-<group>-<n>`, then the pod; under "
        "`avcc dev`, `var/workers` (the group is left stopped until then). After a restore into "
        "a new broker, every data dir must go.",
        constant="EXIT_TABLES_AHEAD_OF_BROKER",
    ),
    ExitStatus(
        69,
        "worker",
        "Nothing if the brokers are coming back: the supervisor starts the worker again. "
        "Otherwise check the brokers, `AVCC_KAFKA_URL` and the network between.",
        constant="EXIT_KAFKA_UNAVAILABLE",
    ),
    ExitStatus(
        70,
        "worker",
        "Nothing for one exit: the supervisor restarts it and the work is processed again "
        "(replays are deduplicated). Repeated exits: look at the broker's health and the lag "
        "page; the worker's log holds the stacks of its tasks at the moment it stopped.",
        constant="STALL_EXIT_CODE",
    ),
    ExitStatus(
        77,
        "worker",
        "The log names each missing operation, topic and the ACL that would allow it: as the "
        "broker's administrator, `avcc kafka acls apply`; check that the worker logs in as its "
        "own group's principal (`avcc kafka acls plan --group GROUP`).",
        constant="EXIT_NOT_AUTHORIZED",
    ),
    ExitStatus(
        78,
        "worker",
        "The log gives librdkafka's reason: check `AVCC_KAFKA_SASL_USERNAME`/`_PASSWORD`, "
        "`AVCC_KAFKA_SSL_CAFILE`, and that `AVCC_KAFKA_SECURITY_PROTOCOL` matches the listener "
        "the URL names. No password is logged.",
        constant="EXIT_KAFKA_LOGIN_REFUSED",
    ),
    ExitStatus(
        134,
        "worker",
        "Nothing for one exit: it is restarted and no message is lost (offsets are committed "
        "after processing, replays are deduplicated). Frequent aborts: report them with the "
        "log's last lines.",
        meaning="Killed by SIGABRT (128 + 6): a native library aborted, such as librdkafka's "
        "assertion `eonce->refcnt > 0` when a connection drops during an admin request.",
    ),
    ExitStatus(
        137,
        "worker",
        "In Kubernetes `OOMKilled` in the pod's last state means its memory limit is too low "
        "for its tables or batches: raise it. Otherwise someone or something sent `kill -9`.",
        meaning="Killed by SIGKILL (128 + 9): the kernel's out-of-memory killer or a forced kill.",
    ),
)


def _sentence(doc: str) -> str:
    """A constant's comment as the meaning of its status: "Exit status of a worker whose ..."
    reads "A worker whose ..." in a table of exit statuses."""
    text = re.sub(r"^Exit status (?:of )?", "", doc)
    return text[:1].upper() + text[1:]


def exit_table() -> str:
    """The troubleshooting table: status, process, meaning (from the code where it names one),
    what to do."""
    by_name = {c.name: c for c in exit_constants()}
    rows = ["| status | process | meaning | what to do |", "|---|---|---|---|"]
    for row in STATUSES:
        meaning = _sentence(by_name[row.constant].doc) if row.constant else row.meaning
        rows.append(f"| {row.status} | {row.process} | {cell(meaning)} | {cell(row.action)} |")
    return "\n".join(rows)
