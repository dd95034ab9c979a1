"""Test factories over the real SQL API (asyncpg), shared by every test tier.

``make_run(conn, status="running")`` drives a run to a state through the zeroth.* functions
themselves (never by writing the table), so a factory can never build a state the API cannot
reach. Time is injected through the test clock of the test databases (``clock_conn``,
``clock_database_dsn``): ``zeroth_test.<function>(..., now_override => t)`` is ``zeroth.<function>``
called at ``t`` (zeroth_pg.testing.install_test_clock). ``T0`` is the instant factories default to.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg

T0 = datetime(2030, 1, 1, tzinfo=UTC)
DEPLOYMENT = "deploy-a"
WORKER = "worker-a"
LEASE = 60.0


def clock_schema(arguments: Any) -> str:
    """``zeroth_test`` when the named arguments carry a ``now_override``, else ``zeroth``."""
    return "zeroth_test" if "now_override" in arguments else "zeroth"


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Lease:
    run_id: UUID
    worker_id: str
    generation: int


async def enqueue(conn: asyncpg.Connection, *, deployment_ref: str = DEPLOYMENT,
                  tenant_id: str | None = None, workspace_id: str | None = None,
                  payload: dict[str, Any] | None = None, now: datetime = T0,
                  **kwargs: Any) -> UUID:
    """zeroth.enqueue_run with defaults; returns the run id."""
    names = ["deployment_ref", "payload", "tenant_id", "workspace_id", "now_override"]
    values: list[Any] = [deployment_ref, json.dumps(payload or {}), tenant_id, workspace_id, now]
    for key, value in kwargs.items():
        names.append(key)
        values.append(json.dumps(value) if key == "metadata" else value)
    args = ", ".join(
        f"{name} => ${i + 1}{'::text::jsonb' if name in ('payload', 'metadata') else ''}"
        for i, name in enumerate(names))
    return await conn.fetchval(f"SELECT run_id FROM zeroth_test.enqueue_run({args})", *values)  # type: ignore[no-any-return]


async def claim(conn: asyncpg.Connection, *, deployment_ref: str = DEPLOYMENT,
                worker_id: str = WORKER, tenant_id: str | None = None,
                workspace_id: str | None = None, max_concurrency: int | None = None,
                batch_size: int = 1, lease_seconds: float = LEASE,
                now: datetime = T0) -> list[asyncpg.Record]:
    """zeroth.claim_pending; returns only the claimed rows (the saturation marker is dropped)."""
    rows = await conn.fetch(
        """SELECT * FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
               tenant_id => $3, workspace_id => $4, max_concurrency => $5, batch_size => $6,
               lease_seconds => $7, now_override => $8)""",
        deployment_ref, worker_id, tenant_id, workspace_id, max_concurrency, batch_size,
        lease_seconds, now)
    return [row for row in rows if row["run_id"] is not None]


async def run_row(conn: asyncpg.Connection, run_id: UUID, *, tenant_id: str = "default",
                  workspace_id: str | None = None) -> asyncpg.Record:
    """The runs row (read directly: tests may look, only functions write)."""
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth.runs r WHERE r.run_id = $1 AND r.tenant_id = $2
               AND r.workspace_id IS NOT DISTINCT FROM $3""", run_id, tenant_id, workspace_id)


async def make_run(conn: asyncpg.Connection, status: str = "pending", *,
                   deployment_ref: str = DEPLOYMENT, worker_id: str = WORKER,
                   tenant_id: str | None = None, workspace_id: str | None = None,
                   max_concurrency: int | None = None, lease_seconds: float = LEASE,
                   now: datetime = T0, **enqueue_kwargs: Any) -> Lease:
    """A run driven to ``status`` through the API.

    status: ``pending`` (not claimed, generation 0), ``claimed`` (pending with a live lease),
    ``running``, ``waiting``, ``completed``, ``failed``, ``cancelled``. For claimed/running the
    lease is (worker_id, generation 1) and lives until ``now + lease_seconds``.
    """
    run_id = await enqueue(conn, deployment_ref=deployment_ref, tenant_id=tenant_id,
                           workspace_id=workspace_id, now=now, **enqueue_kwargs)
    if status == "pending":
        return Lease(run_id, worker_id, 0)
    rows = await conn.fetch(
        """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, tenant_id => $3, workspace_id => $4, max_concurrency => $5,
               batch_size => 1000, lease_seconds => $6, now_override => $7)""",
        deployment_ref, worker_id, tenant_id, workspace_id, max_concurrency, lease_seconds, now)
    mine = [row for row in rows if row["run_id"] == run_id]
    assert mine, f"make_run could not claim {run_id}"
    lease = Lease(run_id, worker_id, mine[0]["lease_generation"])
    # Give back whatever else the batch claim took, so other runs stay as the test left them.
    for row in rows:
        if row["run_id"] is not None and row["run_id"] != run_id:
            await conn.execute(
                """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                       tenant_id => $4, workspace_id => $5, now_override => $6)""",
                row["run_id"], worker_id, row["lease_generation"], tenant_id, workspace_id, now)
    if status == "claimed":
        return lease
    fence = (lease.run_id, worker_id, lease.generation)
    scope = (tenant_id, workspace_id, now)
    assert await conn.fetchval(
        """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               tenant_id => $4, workspace_id => $5, now_override => $6)""", *fence, *scope)
    if status == "running":
        return lease
    if status == "waiting":
        assert await conn.fetchval(
            """SELECT zeroth_test.pause_run(run_id => $1, worker_id => $2, generation => $3,
                   reason => 'approval', tenant_id => $4, workspace_id => $5,
                   now_override => $6)""", *fence, *scope)
    elif status == "completed":
        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   output => '{"ok": true}', tenant_id => $4, workspace_id => $5,
                   now_override => $6)""", *fence, *scope)
    elif status == "failed":
        outcome = await conn.fetchval(
            """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                   error => '{"reason": "boom"}', retryable => false, tenant_id => $4,
                   workspace_id => $5, now_override => $6)""", *fence, *scope)
        assert outcome == "failed"
    elif status == "cancelled":
        assert await conn.fetchval(
            """SELECT zeroth_test.cancel_run(run_id => $1, worker_id => $2, generation => $3,
                   tenant_id => $4, workspace_id => $5, now_override => $6)""", *fence, *scope)
    else:
        raise ValueError(f"unknown status {status!r}")
    return lease


def property_settings(*, ci_examples: int, **overrides: Any) -> Any:
    """hypothesis settings for the property and fuzz tiers: ``ci_examples`` examples, the same
    ones on every run (derandomized, so CI is deterministic), unless the environment variable
    ZEROTH_PG_HYPOTHESIS_EXAMPLES asks for a longer, randomized run."""
    import os

    from hypothesis import HealthCheck, settings

    examples = os.environ.get("ZEROTH_PG_HYPOTHESIS_EXAMPLES")
    return settings(max_examples=int(examples) if examples else ci_examples,
                    derandomize=not examples, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    **overrides)


def save_report(name: str, figures: dict[str, Any]) -> None:
    """Print a test's figures and save them as JSON in ZEROTH_PG_TEST_REPORTS (default
    build/test-reports), so a run reports what it exercised, not only pass/fail."""
    import os
    from pathlib import Path

    text = json.dumps(figures, indent=2, default=str, sort_keys=True)
    print(f"\n{name}: {text}")
    directory = Path(os.environ.get("ZEROTH_PG_TEST_REPORTS", "build/test-reports"))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(text + "\n")


class BlockingConnection:
    """An asyncpg connection on a private event loop, for synchronous callers that cannot await
    (hypothesis rules and @given functions)."""

    def __init__(self, dsn: str, **connect_kwargs: Any) -> None:
        import asyncio

        # loop_factory: the runner leaves the thread's current event loop (pytest-asyncio's) alone.
        self._runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        self.conn: asyncpg.Connection = self.run(asyncpg.connect(dsn, **connect_kwargs))

    def run(self, awaitable: Any) -> Any:
        """Run a coroutine on this connection's loop and return its result."""
        return self._runner.run(awaitable)

    def close(self) -> None:
        try:
            self.run(self.conn.close())
        finally:
            self._runner.close()


# -- waiting on workers (integration tests) -------------------------------------------------------


def unique_deployment(prefix: str) -> str:
    """A deployment name no other test uses (metrics are labelled by deployment)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def metric(name: str, deployment: str, **labels: str) -> float:
    """A worker metric's current value for one deployment (and ``labels``; 0 before its first
    increment)."""
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, {"deployment": deployment, **labels}) or 0.0


async def wait_until(predicate: Callable[[], Any], what: str, *, within: float,
                     interval: float = 0.01) -> Any:
    """Poll ``predicate`` (sync or async) until it returns something truthy; fail after
    ``within`` seconds, naming ``what`` was awaited (a deadline, never a timing assertion)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(interval)




Scope = tuple[str, str | None, str | None]
DEFAULT_SCOPE: Scope = (DEPLOYMENT, None, None)


async def announce_idle(conn: asyncpg.Connection, deployment_ref: str = DEPLOYMENT,
                        tenant_id: str | None = None, workspace_id: str | None = None,
                        ) -> list[int]:
    """This session waits for work of the scope (zeroth.announce_idle): the stripes it holds."""
    return list(await conn.fetchval(
        "SELECT zeroth.announce_idle(deployment_ref => $1, tenant_id => $2, workspace_id => $3)",
        deployment_ref, tenant_id, workspace_id))


async def listen(connection: asyncpg.Connection, channel: str,
                 scopes: tuple[Scope, ...] = ()) -> asyncio.Queue[str]:
    """LISTEN on ``connection``; the payloads of ``channel`` land in the returned queue. On
    ``zeroth_wakeup`` the connection also waits for work of ``scopes`` (default: the default
    scope) like an idle worker: writers notify only while one does (the wakeup gate)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    await connection.add_listener(channel, lambda *args: queue.put_nowait(args[3]))
    if channel == "zeroth_wakeup":
        for scope in scopes or (DEFAULT_SCOPE,):
            assert len(await announce_idle(connection, *scope)) == 8
    return queue


async def wakeup_listener(connect: Any, scopes: tuple[Scope, ...] = (DEFAULT_SCOPE,),
                          channel: str = "zeroth_wakeup") -> asyncio.Queue[str]:
    """A dedicated connection that LISTENs and, like an idle worker, holds the wakeup gate of
    ``scopes`` (writers notify only while a worker waits); payloads land in the queue."""
    return await listen(await connect(), channel, scopes)


async def wakeup_key(conn: asyncpg.Connection, deployment_ref: str = DEPLOYMENT,
                     tenant_id: str | None = None, workspace_id: str | None = None) -> str:
    """The opaque payload zeroth_wakeup carries for this scope (zeroth.wakeup_key)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT zeroth.wakeup_key(deployment_ref => $1, tenant_id => $2, workspace_id => $3)",
        deployment_ref, tenant_id, workspace_id)


async def control_key(conn: asyncpg.Connection, worker_id: str = WORKER) -> str:
    """The opaque payload zeroth_control carries for a worker id (zeroth.control_key)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT zeroth.control_key(worker_id => $1)", worker_id)


async def run_finished_key(conn: asyncpg.Connection, run_id: UUID, tenant_id: str | None = None,
                           workspace_id: str | None = None) -> str:
    """The opaque payload zeroth_run_finished carries for a run (zeroth.run_finished_key)."""
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT zeroth.run_finished_key(run_id => $1, tenant_id => $2, workspace_id => $3)",
        run_id, tenant_id, workspace_id)


async def next_payload(queue: asyncio.Queue[str]) -> str:
    """The next notification payload. The timeout is a failure bound only: the notification was
    committed before the test waits."""
    return await asyncio.wait_for(queue.get(), timeout=10)



#: The origin a dashboard test client speaks from: a loopback name the dashboard answers.
DASHBOARD_ORIGIN = "http://127.0.0.1"


def dashboard(app: Any, **kwargs: Any) -> Any:
    """Starlette's TestClient for the zeroth-pg web ``app`` as the operator's browser on it sends
    its requests: Host 127.0.0.1 and the dashboard's own Origin (which a browser sends on every
    POST; the dashboard refuses a foreign Host, and a POST from another origin)."""
    from starlette.testclient import TestClient

    headers = {"Origin": DASHBOARD_ORIGIN, **kwargs.pop("headers", {})}
    return TestClient(app, base_url=DASHBOARD_ORIGIN, headers=headers, **kwargs)
