"""Calls of the child-run functions (sql/functions/start_child_run.sql, wait_for_children.sql),
shared by the child-run tests of every tier.

Each helper calls one zeroth.* function with named notation; ``now`` (a datetime) goes through the
test clock (``zeroth_test.*``), ``now=None`` calls ``zeroth.*`` itself (databases without the
clock, committed sessions). Children run on their own deployment (``CHILD``), so a claim of the
parent's deployment never takes one.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from helpers import WORKER

CHILD = "child-d"


async def start_child(conn: asyncpg.Connection, parent: UUID, generation: int, key: str, *,
                      deployment: str = CHILD, payload: dict[str, Any] | None = None,
                      detached: bool = False, max_attempts: int = 3, worker: str = WORKER,
                      tenant: str | None = None, workspace: str | None = None,
                      now: datetime | None = None,
                      ) -> asyncpg.Record:
    """zeroth.start_child_run; the row (child_run_id, created)."""
    schema = "zeroth" if now is None else "zeroth_test"
    args = [parent, worker, generation, key, deployment, json.dumps(payload or {}), detached,
            tenant, workspace, max_attempts] + ([] if now is None else [now])
    clock = "" if now is None else ", now_override => $11"
    return await conn.fetchrow(
        f"""SELECT child_run_id, created FROM {schema}.start_child_run(run_id => $1,
                worker_id => $2, generation => $3, step_key => $4, deployment_ref => $5,
                payload => $6::text::jsonb, detached => $7, tenant_id => $8,
                workspace_id => $9, max_attempts => $10{clock})""", *args)


async def wait_children(conn: asyncpg.Connection, parent: UUID, generation: int, key: str,
                        children: list[UUID], *, mode: str = "all", worker: str = WORKER,
                        tenant: str | None = None, workspace: str | None = None,
                        now: datetime | None = None) -> tuple[str | None, Any]:
    """zeroth.wait_for_children; (outcome, decoded children)."""
    schema = "zeroth" if now is None else "zeroth_test"
    clock = "" if now is None else ", now_override => $9"
    args = [parent, worker, generation, key, children, mode, tenant, workspace] + (
        [] if now is None else [now])
    row = await conn.fetchrow(
        f"""SELECT outcome, children::text AS children FROM {schema}.wait_for_children(
                run_id => $1, worker_id => $2, generation => $3, step_key => $4,
                child_run_ids => $5::uuid[], mode => $6, tenant_id => $7,
                workspace_id => $8{clock})""", *args)
    return row["outcome"], None if row["children"] is None else json.loads(row["children"])


async def claim_start(conn: asyncpg.Connection, deployment: str, *, worker: str = WORKER,
                      tenant: str | None = None, workspace: str | None = None,
                      now: datetime | None = None, batch_size: int = 1000,
                      ) -> dict[UUID, int]:
    """zeroth.claim_and_start on ``deployment``: {run_id: generation} of what it took."""
    schema = "zeroth" if now is None else "zeroth_test"
    clock = "" if now is None else ", now_override => $6"
    rows = await conn.fetch(
        f"""SELECT run_id, lease_generation FROM {schema}.claim_and_start(deployment_ref => $1,
                worker_id => $2, tenant_id => $3, workspace_id => $4, batch_size => $5{clock})
             WHERE run_id IS NOT NULL""",
        deployment, worker, tenant, workspace, batch_size, *([] if now is None else [now]))
    return {row["run_id"]: row["lease_generation"] for row in rows}


async def finish(conn: asyncpg.Connection, run_id: UUID, generation: int, how: str, *,
                 value: Any = None, worker: str = WORKER, tenant: str | None = None,
                 workspace: str | None = None, now: datetime | None = None) -> Any:
    """End a running run: ``complete`` (output value), ``fail`` (non-retryable, error value),
    ``dead_letter`` (retryable with no attempt left), ``cancel`` (cancel_run by its holder)."""
    schema = "zeroth" if now is None else "zeroth_test"
    clock = [] if now is None else [now]
    fence = (run_id, worker, generation)
    n = 7 if how in ("complete", "fail", "dead_letter") else 6
    tail = "" if now is None else f", now_override => ${n}"
    if how == "complete":
        return await conn.fetchval(
            f"""SELECT {schema}.complete_run(run_id => $1, worker_id => $2, generation => $3,
                    output => $4::text::jsonb, tenant_id => $5, workspace_id => $6{tail})""",
            *fence, json.dumps(value), tenant, workspace, *clock)
    if how in ("fail", "dead_letter"):
        return await conn.fetchval(
            f"""SELECT {schema}.fail_run(run_id => $1, worker_id => $2, generation => $3,
                    error => $4::text::jsonb, retryable => {str(how == 'dead_letter').lower()},
                    tenant_id => $5, workspace_id => $6{tail})""",
            *fence, json.dumps(value), tenant, workspace, *clock)
    if how == "cancel":
        return await conn.fetchval(
            f"""SELECT {schema}.cancel_run(run_id => $1, worker_id => $2, generation => $3,
                    tenant_id => $4, workspace_id => $5{tail})""", *fence, tenant, workspace,
            *clock)
    raise ValueError(how)


async def status(conn: asyncpg.Connection, run_id: UUID) -> tuple[str, str | None]:
    """(status, wait_reason) of a run, read directly."""
    row = await conn.fetchrow(
        "SELECT status::text AS status, wait_reason FROM zeroth.runs WHERE run_id = $1", run_id)
    return row["status"], row["wait_reason"]
