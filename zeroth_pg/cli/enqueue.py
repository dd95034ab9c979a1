"""``zeroth-pg enqueue``: one run, or one per JSON line on stdin (``--batch``)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zeroth_pg import _calls
from zeroth_pg.cli._common import (
    Dsn,
    JsonOutput,
    Tenant,
    UsageError,
    Workspace,
    json_object,
    out,
    parse_duration,
    print_json,
    rows_table,
    run_async,
)

if TYPE_CHECKING:
    import asyncpg

__all__ = ["enqueue"]

async def _absolute_time(conn: asyncpg.Connection, text: str | None) -> datetime | None:
    """``--run-after``: an ISO timestamp, or a duration from now on the database clock."""
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=UTC)
    try:
        delay = parse_duration(text)
    except typer.BadParameter:
        raise UsageError(f"--run-after {text!r} is neither an ISO timestamp nor a duration "
                         "(30s, 5m, 1h)") from None
    return await conn.fetchval(_calls.DATABASE_NOW_PLUS, delay)  # type: ignore[no-any-return]


def _batch_items(lines: Sequence[str], defaults: dict[str, Any]) -> list[dict[str, Any]]:
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"stdin line {number}: not valid JSON: {exc}") from exc
        if not isinstance(item, dict):
            raise UsageError(f"stdin line {number}: each line must be a JSON object")
        items.append({**defaults, **item})
    return items


def enqueue(
    deployment: Annotated[str, typer.Option(
        "--deployment", envvar="ZEROTH_PG_DEPLOYMENT", help="Deployment the runs are for.")],
    payload: Annotated[str | None, typer.Option(
        help="The run's payload, a JSON object (single run).", show_default=False)] = None,
    priority: Annotated[int | None, typer.Option(
        help="Higher runs first (default: the deployment's registered priority, else 0; with "
             "--batch: for lines without one).",
        show_default=False)] = None,
    run_after: Annotated[str | None, typer.Option(
        help="Not before: ISO timestamp, or a duration from now on the database clock (30s, "
             "5m).", show_default=False)] = None,
    max_attempts: Annotated[int | None, typer.Option(
        help="Attempts before a failing run is dead-lettered (default: the deployment's "
             "registered max_attempts, else 3; see `zeroth-pg deployments list`).",
        show_default=False)] = None,
    idempotency_key: Annotated[str | None, typer.Option(
        help="A repeated key returns the existing run (created: false).",
        show_default=False)] = None,
    metadata: Annotated[str | None, typer.Option(
        help="Metadata, a JSON object.", show_default=False)] = None,
    batch: Annotated[bool, typer.Option(
        "--batch", help="Enqueue one run per JSON line on stdin, each an object with optional "
        "payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, "
        "thread_id.")] = False,
    chunk_size: Annotated[int, typer.Option(
        envvar="ZEROTH_PG_ENQUEUE_CHUNK", min=1, max=10000,
        help="Runs per enqueue_runs call with --batch.")] = 1000,
    tenant: Tenant = None,
    workspace: Workspace = None,
    dsn: Dsn = None,
    as_json: JsonOutput = False,
) -> None:
    """Create one run (zeroth.enqueue_run), or many from JSON lines on stdin (--batch)."""
    from zeroth_pg.client import LeaseManager

    if batch and (payload is not None or idempotency_key is not None):
        raise typer.BadParameter("--payload and --idempotency-key name one run; with --batch "
                                 "put them on each stdin line")
    payload_obj = json_object(payload, "--payload") if payload is not None else {}
    metadata_obj = json_object(metadata, "--metadata") if metadata is not None else None
    lines = sys.stdin.read().splitlines() if batch else []

    async def work(conn: asyncpg.Connection) -> list[Any]:
        lm = LeaseManager(conn)
        when = await _absolute_time(conn, run_after)
        if not batch:
            return [await lm.enqueue_run(
                deployment, payload_obj, tenant_id=tenant, workspace_id=workspace,
                priority=priority, run_after=when, max_attempts=max_attempts,
                idempotency_key=idempotency_key, metadata=metadata_obj)]
        defaults = {key: value for key, value in (
            ("priority", priority), ("run_after", when), ("max_attempts", max_attempts),
            ("metadata", metadata_obj)) if value is not None}
        items = _batch_items(lines, defaults)
        results: list[Any] = []
        for start in range(0, len(items), chunk_size):
            results += await lm.enqueue_runs(deployment, items[start:start + chunk_size],
                                             tenant_id=tenant, workspace_id=workspace)
        return results

    enqueued = run_async(dsn, work)
    rows = [{"run_id": run.run_id, "created": run.created, "status": run.status}
            for run in enqueued]
    if as_json:
        if batch:
            for row in rows:
                print_json(row)
        else:
            print_json(rows[0])
    elif batch:
        created = sum(1 for row in rows if row["created"])
        out.print(f"enqueued {len(rows)} run(s) for {deployment}: {created} created, "
                   f"{len(rows) - created} already there (idempotency key or run id)")
    else:
        out.print(rows_table(rows, [("run_id", "run_id"), ("created", "created"),
                                 ("status", "status")]))
