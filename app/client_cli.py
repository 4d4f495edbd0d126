"""``avcc client`` and ``avcc import``: the partner client (:mod:`app.client`) on the command line -
apply, read a record, import an NDJSON file of applications.

Meant for the README's quick start and for trying a stack by hand: it signs with ``--key`` /
``--secret`` (the dev stack's shipped key by default) and talks to the code worker at ``--url``
(by default the local stack's, ``AVCC_WEB_PORT`` + 1).
"""

from __future__ import annotations

import hashlib
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson

from app.bulk_import import import_file, state_path_for
from app.client import ApiError, AvccClient, DuplicateContent
from app.platform.groups import group_spec
from app.platform.settings import DEV_HMAC_KEYS, Settings

__all__ = ["client", "import_cmd"]

_DEV_KEY, _DEV_SECRET = next(iter(DEV_HMAC_KEYS.items()))


def _default_url() -> str:
    settings = Settings()
    return f"http://127.0.0.1:{settings.web_port + group_spec('code').port_offset}"


def _echo(body: Any) -> None:
    click.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode())


@click.group()
@click.option("--url", envvar="AVCC_CLIENT_URL", default=None, help="Code worker base URL.")
@click.option("--key", envvar="AVCC_CLIENT_KEY", default=_DEV_KEY, show_default=True)
@click.option("--secret", envvar="AVCC_CLIENT_SECRET", default=_DEV_SECRET, show_default=True)
@click.pass_context
def client(ctx: click.Context, url: str | None, key: str, secret: str) -> None:
    """Signed requests to the /v1/ API (the dev key by default)."""
    ctx.obj = AvccClient(url or _default_url(), key, secret)


@client.command("apply")
@click.option("--title", required=True)
@click.option("--content-url", required=True, help="Where the work is stored (s3://, https://).")
@click.option("--content-hash", default=None, help="sha256:<hex> of the work (default: of the URL).")
@click.option("--model-name", default="Stable-Diffusion-XL", show_default=True)
@click.option("--model-version", default="v1.0", show_default=True)
@click.option("--applicant", default="applicant-quickstart", show_default=True)
@click.option("--print-id", is_flag=True, help="Print only the record id.")
@click.pass_obj
def apply_cmd(
    api: AvccClient,
    title: str,
    content_url: str,
    content_hash: str | None,
    model_name: str,
    model_version: str,
    applicant: str,
    print_id: bool,
) -> None:
    """Apply for an AVCC code; prints the receipt (for a known work: the 409 naming its record)."""
    body = {
        "request_id": f"req_{uuid.uuid4().hex[:16]}",
        "content_url": content_url,
        "content_hash": content_hash or "sha256:" + hashlib.sha256(content_url.encode()).hexdigest(),
        "ai_tool_info": {"model_name": model_name, "model_version": model_version},
        "title": title,
        "applicant_id": applicant,
    }
    try:
        answer = api.apply(body)
    except DuplicateContent as exc:
        if not isinstance(exc.body, dict):
            raise click.ClickException(str(exc)) from exc
        click.echo(f"this work already has record {exc.body.get('avcc_record_id')}", err=True)
        answer = exc.body
    except ApiError as exc:
        raise click.ClickException(str(exc)) from exc
    if print_id:
        click.echo(str(answer["avcc_record_id"]))
    else:
        _echo(answer)


@client.command("record")
@click.argument("avcc_record_id", type=int)
@click.option("--until", "until_status", default=None, help="Poll until the record has this status.")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True)
@click.pass_obj
def record_cmd(api: AvccClient, avcc_record_id: int, until_status: str | None, timeout_s: float) -> None:
    """Print a record with its history (optionally once it reached ``--until``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            record = api.record(avcc_record_id)
        except ApiError as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise click.ClickException(str(exc)) from exc
            record = {}
        if until_status is None or record.get("status") == until_status:
            _echo(record)
            return
        if time.monotonic() > deadline:
            _echo(record)
            click.echo(f"record {avcc_record_id} is not {until_status} after {timeout_s:g} s", err=True)
            sys.exit(1)
        time.sleep(0.5)


@click.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--url", envvar="AVCC_CLIENT_URL", default=None, help="Code worker base URL.")
@click.option("--key", envvar="AVCC_CLIENT_KEY", default=_DEV_KEY, show_default=True)
@click.option("--secret", envvar="AVCC_CLIENT_SECRET", default=_DEV_SECRET, show_default=True)
@click.option(
    "--state",
    "state_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Resume file (default: PATH.import-state); lines answered in it are skipped.",
)
@click.option("--batch-size", default=1_000, show_default=True, type=click.IntRange(1, 1_000))
@click.option("--quiet", is_flag=True, help="No progress bar.")
def import_cmd(
    path: Path, url: str | None, key: str, secret: str, state_path: Path | None, batch_size: int, quiet: bool
) -> None:
    """Apply for every line of an NDJSON file of applications; resumable, prints a JSON summary."""
    api = AvccClient(url or _default_url(), key, secret, max_retries=60)
    with path.open("rb") as source:
        total = sum(1 for raw in source if raw.strip())
    with click.progressbar(length=total, label="importing", file=sys.stderr, hidden=quiet) as bar:
        try:
            summary = import_file(
                api, path, state_path=state_path, batch_size=batch_size, progress=bar.update
            )
        except (ApiError, OSError) as exc:  # OSError: the worker cannot be reached
            raise click.ClickException(
                f"{exc} (rerun to resume: {state_path or state_path_for(path)})"
            ) from exc
    _echo(summary.as_dict())
