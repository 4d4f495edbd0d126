"""The ``avcc`` command line: topic plan, contract validation, workers, dev stack, operations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from app.client_cli import client, import_cmd
from app.platform.topics import TOPIC_PLAN

__all__ = ["main"]


@click.group()
def main() -> None:
    """AIGC-Hub AVCC event pipeline."""


@main.group()
def topics() -> None:
    """The topic plan: print it, apply it to the broker."""


@topics.command("plan")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def topics_plan(as_json: bool) -> None:
    """Print the topic plan (the one source of truth for topics)."""
    if as_json:
        click.echo(orjson.dumps([s.as_dict() for s in TOPIC_PLAN], option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(f"{'topic':36} {'parts':>5} {'retention':>10} {'cleanup':8} {'key':16} profile")
    for s in TOPIC_PLAN:
        days = "infinite" if s.retention_days is None else f"{s.retention_days:g}d"
        click.echo(
            f"{s.name:36} {s.partitions:>5} {days:>10} {s.cleanup_policy:8} {s.key_field:16} {s.profile}"
        )


@topics.command("apply")
@click.option("--grow-partitions", is_flag=True, help="Grow partition counts below the plan (remaps keys!).")
def topics_apply(grow_partitions: bool) -> None:
    """Create missing topics and verify existing ones; exit 1 on drift that was not fixed."""
    from app.platform.internal_topics import changelog_specs
    from app.platform.kafka.admin import apply_plan
    from app.platform.settings import get_settings

    plan = [*TOPIC_PLAN, *changelog_specs()]
    report = apply_plan(get_settings(), plan, grow_partitions=grow_partitions)
    for name in report.created:
        click.echo(f"created {name}")
    for drift in report.drift:
        click.echo(f"drift: {drift.line()}", err=not drift.fixed)
    if report.unfixed:
        if any(d.setting == "partitions" for d in report.unfixed):
            click.echo(
                "partition drift left alone; rerun with --grow-partitions to grow "
                "(WARNING: keys remap, per-record order breaks for in-flight records)",
                err=True,
            )
        sys.exit(1)
    if not report.created and not report.drift:
        click.echo("no drift")


@main.group()
def kafka() -> None:
    """Kafka security: the least-privilege ACLs of every agent group."""


@kafka.group()
def acls() -> None:
    """ACLs generated from the topic plan: one principal per group (User:avcc-<group>)."""


@acls.command("plan")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@click.option("--group", "only", default=None, help="Only this group's grants.")
def acls_plan(as_json: bool, only: str | None) -> None:
    """Print every group's grants (ALLOW, any host)."""
    from app.platform.groups import GROUPS, group_spec
    from app.platform.kafka.acls import acl_plan

    try:
        groups = [group_spec(only)] if only else list(GROUPS)
    except KeyError as exc:
        raise click.UsageError(str(exc)) from None
    plan = acl_plan(groups)
    if as_json:
        click.echo(orjson.dumps([g.as_dict() for g in plan], option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(f"{'principal':24} {'operation':16} {'type':5} {'pattern':8} resource")
    for grant in plan:
        click.echo(grant.line())


@acls.command("apply")
def acls_apply() -> None:
    """Create the planned grants that are missing, as the broker's administrator (the AVCC_KAFKA_*
    credentials must be a super user's); ACLs of these principals beyond the plan are listed, never
    deleted."""
    from app.platform.kafka.acls import acl_plan, apply_acls
    from app.platform.kafka.clients import admin_client
    from app.platform.settings import get_settings

    plan = acl_plan()
    created, extra = apply_acls(admin_client(get_settings()), plan)
    for grant in created:
        click.echo(f"created {grant.line()}")
    for line in extra:
        click.echo(f"not in plan (left alone): {line}")
    click.echo(f"{len(plan)} grants planned, {len(created)} created, {len(extra)} beyond the plan")


@main.group()
def clickhouse() -> None:
    """The sink's ClickHouse tables: on one server, or on a cluster (AVCC_CLICKHOUSE_CLUSTER)."""


@clickhouse.command("plan")
@click.option("--cluster", default=None, help="Cluster name (default: AVCC_CLICKHOUSE_CLUSTER).")
@click.option("--database", default="avcc", show_default=True, help="Database the tables go in.")
def clickhouse_plan(cluster: str | None, database: str) -> None:
    """Print the DDL of the sink's tables (no server needed)."""
    from app.platform.settings import get_settings
    from app.playback.sink.cluster import cluster_tables
    from app.playback.sink.store import TABLE_COLUMNS, table_ddl

    cluster = cluster or get_settings().clickhouse_cluster
    if cluster:
        statements = [table.ddl for table in cluster_tables(cluster, database)]
    else:
        statements = [table_ddl(table) for table in TABLE_COLUMNS]
    click.echo(";\n\n".join(statements) + ";")


@clickhouse.command("apply")
def clickhouse_apply() -> None:
    """Create the missing tables at AVCC_CLICKHOUSE_URL (on AVCC_CLICKHOUSE_CLUSTER if set) and
    verify the rest; a table with another schema is reported (exit 1), never dropped."""
    from app.platform.settings import get_settings
    from app.playback.sink.clickhouse import connect
    from app.playback.sink.store import ensure_schema

    settings = get_settings()
    backend = connect(settings.clickhouse_url, settings.data_dir, settings.clickhouse_cluster)
    try:
        report = ensure_schema(backend)
    finally:
        backend.close()
    for table in report.created:
        click.echo(f"created {table}")
    for column in report.added_columns:
        click.echo(f"added {column}")
    for drift in report.type_drift:
        click.echo(f"drift: {drift}", err=True)
    if report.type_drift:
        sys.exit(1)
    if not report.created and not report.added_columns:
        click.echo("no drift")


@main.command()
@click.argument("topic")
@click.argument("file", type=click.File("rb"), default="-")
def validate(topic: str, file: click.utils.LazyFile) -> None:
    """Validate one JSON event for TOPIC from FILE (default: stdin).

    Exit 0 if valid; 1 with a one-line reason naming the field(s) on stderr; 2 on usage errors.
    """
    from app.platform.contracts import validate_event
    from app.platform.errors import NON_RETRIABLE
    from app.platform.topics import spec_for

    try:
        spec_for(topic)
    except KeyError:
        raise click.UsageError(f"unknown topic {topic!r}; see `avcc topics plan`") from None
    raw = file.read()
    try:
        validate_event(topic, raw)
    except NON_RETRIABLE as exc:
        click.echo(f"invalid: {exc}", err=True)
        sys.exit(1)
    click.echo("valid")


@main.group()
def contracts() -> None:
    """Published event contracts (schemas/json, schemas/asyncapi.yaml)."""


@contracts.command("check")
@click.option("--against", "ref", required=True, help="Git ref whose published schemas must stay valid.")
def contracts_check(ref: str) -> None:
    """Fail (exit 1, naming each field) on a backward-incompatible change of a payload since REF."""
    from app.contract_docs.check import check_against

    sys.exit(check_against(ref))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("group")
@click.pass_context
def worker(ctx: click.Context, group: str) -> None:
    """Run the worker of agent GROUP (extra args go to `faust worker`)."""
    from app.platform.groups import group_spec
    from app.worker import run_worker

    try:
        spec = group_spec(group)
    except KeyError as exc:
        raise click.UsageError(str(exc)) from None
    run_worker(spec, list(ctx.args))


@main.command()
@click.option("--groups", default="", help="Comma-separated groups (default: all).")
@click.option("--no-broker", is_flag=True, help="Use AVCC_KAFKA_URL as is; start no embedded broker.")
@click.option(
    "--chain",
    "chain_kind",
    type=click.Choice(["local", "evm"]),
    default="local",
    help="local: the local ledger; evm: start a ganache node, deploy the registry, use it.",
)
def dev(groups: str, no_broker: bool, chain_kind: str) -> None:
    """Start the local stack: embedded broker + ClickHouse, the topic plan, every agent group."""
    from app.dev import run_dev_stack

    wanted = [g for g in groups.split(",") if g]
    sys.exit(run_dev_stack(wanted or None, start_broker=not no_broker, chain=chain_kind))


@main.group()
def chain() -> None:
    """The chain backend: the local ledger or an EVM node (AVCC_CHAIN_URL)."""


@chain.command("verify")
@click.option("--path", type=click.Path(path_type=Path), default=None, help="Ledger directory.")
def chain_verify(path: Path | None) -> None:
    """Local ledger: re-check every block. EVM: re-read every record's registration from the contract."""
    from app.lifecycle.chain.backends import backend_kind
    from app.platform.settings import get_settings

    settings = get_settings()
    if backend_kind(settings) == "evm":
        from app.lifecycle.chain.evm_verify import verify_evm_cli

        sys.exit(verify_evm_cli(settings))
    from app.lifecycle.chain.ledger import verify_ledger_cli

    sys.exit(verify_ledger_cli(path))


@chain.command("node")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=6075, show_default=True, type=int, help="Port to listen on.")
@click.option("--path", type=click.Path(path_type=Path), default=None, help="Ledger directory.")
def chain_node(host: str, port: int, path: Path | None) -> None:
    """Serve the local ledger to every chain replica (they use AVCC_CHAIN_URL=ledger://host:port);
    requires AVCC_CHAIN_NODE_TOKEN."""
    import asyncio
    import logging

    from app.lifecycle.chain.node import run_ledger_node
    from app.platform.settings import get_settings

    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if settings.chain_node_token is None:
        raise click.UsageError("set AVCC_CHAIN_NODE_TOKEN: chain replicas authenticate with it")
    ledger = path if path is not None else settings.resolve_data_path("ledger")
    token = settings.chain_node_token.get_secret_value()
    asyncio.run(run_ledger_node(ledger, host, port, token, settings.block_interval_ms))


@chain.command("deploy")
def chain_deploy() -> None:
    """Deploy AvccRegistry to AVCC_CHAIN_URL, signed by AVCC_CHAIN_KEY_FILE; print its address."""
    from app.lifecycle.chain.backends import backend_kind
    from app.platform.settings import get_settings

    settings = get_settings()
    if backend_kind(settings) != "evm":
        raise click.UsageError("AVCC_CHAIN_URL must name an EVM node (http(s)://host:port) to deploy to")
    from app.lifecycle.chain.deploy import deploy_registry
    from app.lifecycle.chain.keys import read_key

    click.echo(deploy_registry(settings.chain_url, read_key(settings)))


@main.command()
def lag() -> None:
    """Print consumer lag and Burrow-style status of every group."""
    from app.ops.lag.pages import print_lag_table
    from app.platform.settings import get_settings

    sys.exit(print_lag_table(get_settings()))


@main.group()
def dlq() -> None:
    """Dead-letter queue: list, show, re-inject, discard."""


@dlq.command("list")
@click.option("--topic", default=None)
@click.option("--group", default=None)
@click.option("--error-class", default=None)
@click.option("--status", default=None, type=click.Choice(["new", "reinjected", "discarded"]))
def dlq_list(topic: str | None, group: str | None, error_class: str | None, status: str | None) -> None:
    """List dead letters matching the filters."""
    from app.ops.dlq.cli import list_cmd

    sys.exit(list_cmd(topic=topic, group=group, error_class=error_class, status=status))


@dlq.command("show")
@click.argument("dlq_id")
def dlq_show(dlq_id: str) -> None:
    """Show one dead letter: headers, payload, stack trace, audit trail."""
    from app.ops.dlq.cli import show_cmd

    sys.exit(show_cmd(dlq_id))


@dlq.command("reinject")
@click.argument("dlq_ids", nargs=-1)
@click.option("--operator", required=True, help="Who re-injects (recorded in the audit trail).")
@click.option("--topic", default=None, help="Bulk: all new messages of this original topic.")
@click.option("--error-class", default=None, help="Bulk: all new messages of this error class.")
def dlq_reinject(dlq_ids: tuple[str, ...], operator: str, topic: str | None, error_class: str | None) -> None:
    """Re-inject dead letters into their original topic (same key and event id)."""
    from app.ops.dlq.cli import reinject_cmd

    sys.exit(reinject_cmd(list(dlq_ids), operator=operator, topic=topic, error_class=error_class))


@dlq.command("discard")
@click.argument("dlq_id")
@click.option("--operator", required=True)
@click.option("--reason", required=True)
def dlq_discard(dlq_id: str, operator: str, reason: str) -> None:
    """Discard a dead letter with a reason (kept in the audit trail)."""
    from app.ops.dlq.cli import discard_cmd

    sys.exit(discard_cmd(dlq_id, operator=operator, reason=reason))


@main.group()
def backup() -> None:
    """Back up the state topics (table changelogs, dead letters) and restore them into an empty cluster."""


@backup.command("export")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--topic", "topics", multiple=True, help="Only this state topic (repeatable; default: all).")
def backup_export(directory: Path, topics: tuple[str, ...]) -> None:
    """Write every state topic's records, read to their end offsets now, into DIRECTORY (new)."""
    from app.ops.backup import BackupError, export_backup
    from app.platform.settings import get_settings

    def done(topic: Any) -> None:
        click.echo(f"exported {topic.name}: {topic.total} records in {topic.partitions} partitions")

    try:
        manifest = export_backup(get_settings(), directory, topics, progress=done)
    except BackupError as exc:
        click.echo(f"backup failed: {exc}", err=True)
        sys.exit(1)
    click.echo(f"{len(manifest.topics)} topics in {directory}; claims end offsets {manifest.claims_ends}")


@backup.command("import")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False, exists=True))
def backup_import(directory: Path) -> None:
    """Restore the backup in DIRECTORY into an empty cluster: the topic plan, every state topic's
    records, and the claims topic's offsets (so new record ids never repeat restored ones)."""
    from app.ops.backup import BackupError, import_backup
    from app.platform.settings import get_settings

    try:
        report = import_backup(
            get_settings(), directory, progress=lambda name, n: click.echo(f"imported {name}: {n} records")
        )
    except BackupError as exc:
        click.echo(f"restore failed: {exc}", err=True)
        sys.exit(1)
    filled = sum(report.claims_fill.values())
    click.echo(
        f"{len(report.records)} topics restored; claims topic filled with {filled} empty records "
        "and the code group's offsets committed past them. Start the workers on empty data dirs."
    )


main.add_command(client)
main.add_command(import_cmd)

if __name__ == "__main__":
    main()
