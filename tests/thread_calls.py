"""Calls of the thread functions (sql/functions/admit_run.sql and friends), shared by the
thread tests.

Each helper calls one zeroth.* function with named notation and ``now_override`` (default
``helpers.T0``) and returns plain dicts, so a test reads like the SQL it exercises.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from helpers import DEPLOYMENT, T0, clock_schema

THREAD = "thread-1"
OWNER = "owner-a"
OTHER = "owner-b"

ACTIVE = """SELECT r.run_id FROM zeroth.runs r
             WHERE r.thread_id = $1 AND r.status IN ('pending', 'running', 'waiting')
               AND r.thread_queued_at IS NULL"""
QUEUE = """SELECT r.run_id FROM zeroth.runs r
            WHERE r.thread_id = $1 AND r.thread_queued_at IS NOT NULL
            ORDER BY r.thread_queued_at, r.run_id"""


def _named(function: str, values: dict[str, Any], json_args: tuple[str, ...] = ()
           ) -> tuple[str, list[Any]]:
    """``zeroth.function(name => $1, …)`` and its parameters; json_args go in as jsonb."""
    args = ", ".join(
        f"{name} => ${i + 1}{'::text::jsonb' if name in json_args else ''}"
        for i, name in enumerate(values))
    params = [json.dumps(value) if name in json_args and value is not None else value
              for name, value in values.items()]
    return f"{clock_schema(values)}.{function}({args})", params


def _call(function: str, values: dict[str, Any], columns: str, json_args: tuple[str, ...] = ()
          ) -> tuple[str, list[Any]]:
    call, params = _named(function, values, json_args)
    return f"SELECT {columns} FROM {call}", params


async def admit(conn: asyncpg.Connection, thread: str = THREAD, strategy: str = "reject", *,
                worker_id: str | None = None, now: datetime = T0,
                deployment_ref: str = DEPLOYMENT, **kwargs: Any) -> dict[str, Any]:
    """zeroth.admit_run; ``displaced`` comes back parsed."""
    values = {"deployment_ref": deployment_ref, "thread_id": thread, "strategy": strategy,
              "worker_id": worker_id, "now_override": now, **kwargs}
    query, params = _call(
        "admit_run", values,
        "outcome, run_id, status::text AS status, lease_generation, lease_expires_at, "
        "active_run_id, retry_after_s, displaced::text AS displaced",
        ("payload", "metadata"))
    row = dict(await conn.fetchrow(query, *params))
    row["displaced"] = json.loads(row["displaced"])
    return row


async def cancel_v2(conn: asyncpg.Connection, run_id: UUID | None, action: str | None = "cancel",
                    *, grace: float = 10, now: datetime = T0, **kwargs: Any) -> dict[str, Any]:
    """zeroth.request_cancel_v2."""
    values = {"run_id": run_id, "action": action, "grace_seconds": grace, "now_override": now,
              **kwargs}
    query, params = _call(
        "request_cancel_v2", values,
        "outcome, run_id, status::text AS status, cancel_action, lease_worker_id, "
        "lease_generation, retry_after_s")
    return dict(await conn.fetchrow(query, *params))


async def take_over(conn: asyncpg.Connection, run_id: UUID | None, *, grace: float = 10,
                    now: datetime = T0, **kwargs: Any) -> list[dict[str, Any]]:
    """zeroth.claim_for_takeover: the rows it returned."""
    values = {"run_id": run_id, "grace_seconds": grace, "now_override": now, **kwargs}
    query, params = _call("claim_for_takeover", values, TAKEOVER_COLUMNS)
    return [dict(row) for row in await conn.fetch(query, *params)]


async def reconcile(conn: asyncpg.Connection, *, grace: float = 10, now: datetime = T0,
                    **kwargs: Any) -> list[dict[str, Any]]:
    """zeroth.reconcile_thread_runs: the rows it returned."""
    values = {"grace_seconds": grace, "now_override": now, **kwargs}
    query, params = _call("reconcile_thread_runs", values, TAKEOVER_COLUMNS)
    return [dict(row) for row in await conn.fetch(query, *params)]


TAKEOVER_COLUMNS = ("run_id, thread_id, outcome, status::text AS status, previous_worker_id, "
                    "previous_generation")


async def fenced(conn: asyncpg.Connection, function: str, run_id: UUID, worker_id: str,
                 generation: int, *, now: datetime = T0, **kwargs: Any) -> Any:
    """One fenced write (start_run, complete_run, cancel_run, …) of (worker, generation)."""
    values = {"run_id": run_id, "worker_id": worker_id, "generation": generation,
              "now_override": now, **kwargs}
    call, params = _named(function, values, ("output", "error", "progress", "accounting"))
    return await conn.fetchval(f"SELECT {call}", *params)


async def active(conn: asyncpg.Connection, thread: str = THREAD) -> list[UUID]:
    return [row["run_id"] for row in await conn.fetch(ACTIVE, thread)]


async def queue(conn: asyncpg.Connection, thread: str = THREAD) -> list[UUID]:
    return [row["run_id"] for row in await conn.fetch(QUEUE, thread)]


async def status(conn: asyncpg.Connection, run_id: UUID) -> str:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1", run_id)


async def own_running(conn: asyncpg.Connection, thread: str = THREAD, *, worker_id: str = OWNER,
                      now: datetime = T0, **kwargs: Any) -> UUID:
    """An admit-and-own run of ``worker_id`` (generation 1), started: status running."""
    admitted = await admit(conn, thread, worker_id=worker_id, now=now, **kwargs)
    assert admitted["outcome"] == "admitted", admitted
    scope = {key: kwargs[key] for key in ("tenant_id", "workspace_id") if key in kwargs}
    assert await fenced(conn, "start_run", admitted["run_id"], worker_id, 1, now=now, **scope)
    return admitted["run_id"]  # type: ignore[no-any-return]
