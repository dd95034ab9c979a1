"""A deployment with a run in every state the fleet gauges count (zeroth_pg.fleet_metrics), in
two tenants, and how to read a scrape of them: shared by the dashboard's /metrics test
(tests/web) and the ``zeroth-pg metrics`` exporter's (tests/cli). Needs a test-clock database."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from helpers import make_run
from prometheus_client.parser import text_string_to_metric_families

#: zeroth_fleet_runs{state} of the deployment seed() fills (the two tenants summed).
EXPECTED_RUNS = {"pending": 3, "due": 2, "scheduled": 1, "running": 2, "waiting": 1,
                 "failed": 1, "dead_lettered": 1}
#: The oldest due run was enqueued this many seconds before the seed (on the database clock).
OLDEST_DUE_SECONDS = 600.0


async def seed(conn: asyncpg.Connection, dep: str) -> datetime:
    """Fill ``dep``; returns the oldest due run's run_after (the database's value)."""
    now: datetime = await conn.fetchval("SELECT clock_timestamp()")
    early = now - timedelta(seconds=OLDEST_DUE_SECONDS)
    oldest = await make_run(conn, "pending", deployment_ref=dep, tenant_id="acme", now=early)
    await make_run(conn, "pending", deployment_ref=dep, tenant_id="initech", now=now)
    await make_run(conn, "pending", deployment_ref=dep, tenant_id="acme", now=now,
                   run_after=now + timedelta(hours=1))
    await make_run(conn, "running", deployment_ref=dep, tenant_id="acme", now=now,
                   lease_seconds=3600)
    # A running run whose worker died an hour ago: its lease expired and nobody took it yet.
    await make_run(conn, "running", deployment_ref=dep, tenant_id="initech", now=early,
                   lease_seconds=60, worker_id="dead-worker")
    await make_run(conn, "waiting", deployment_ref=dep, tenant_id="acme", now=now)
    await make_run(conn, "failed", deployment_ref=dep, tenant_id="initech", now=now)
    letter = await make_run(conn, "running", deployment_ref=dep, tenant_id="acme", now=now,
                            max_attempts=1)
    outcome = await conn.fetchval(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => $4::jsonb, retryable => true, tenant_id => 'acme', now_override => $5)""",
        letter.run_id, letter.worker_id, letter.generation, json.dumps({"message": "boom"}), now)
    assert outcome == "dead_lettered"
    run_after: datetime = await conn.fetchval(
        "SELECT run_after FROM zeroth.runs WHERE run_id = $1", oldest.run_id)
    return run_after


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text exposition, by (name, labels)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def check_scrape(text: str, dep: str, *, age_before: float, age_after: float) -> None:
    """The scrape ``text`` shows what seed() made in ``dep``, with no tenant label, and the
    oldest due age between the database's own measures taken before and after it."""
    found = samples(text)
    runs = {state: value(found, "zeroth_fleet_runs", deployment=dep, state=state)
            for state in EXPECTED_RUNS}
    assert runs == {state: float(n) for state, n in EXPECTED_RUNS.items()}, runs
    assert value(found, "zeroth_fleet_live_leases", deployment=dep) == 1.0
    assert value(found, "zeroth_fleet_expired_leases", deployment=dep) == 1.0
    assert value(found, "zeroth_fleet_paused_scopes", deployment=dep) == 0.0
    age = value(found, "zeroth_fleet_oldest_due_age_seconds", deployment=dep)
    assert age is not None
    assert age_before <= age <= age_after
    mine: list[Any] = [labels for (_, labels) in found if ("deployment", dep) in labels]
    assert all({key for key, _ in labels} <= {"deployment", "state"} for labels in mine)


async def due_age(conn: asyncpg.Connection, run_after: datetime) -> float:
    """How long the run due at ``run_after`` has waited, on the database clock, now."""
    age: float = await conn.fetchval(
        "SELECT extract(epoch FROM clock_timestamp() - $1::timestamptz)::float8", run_after)
    return age
