"""The App registers its deployments' defaults in the database (zeroth.deployments) when it opens
its pool, so that a run enqueued from psql, another language or the CLI without max_attempts /
priority gets them — not only Deployment.enqueue. A second App with other values wins (the last
registration) with an audit row and a warning; a DBA's setting is kept and is what the App's own
enqueues get."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess

import asyncpg
import pytest
from helpers import wait_until
from roles import dsn_as, login_role

from zeroth_pg import App, LeaseManager, RetryPolicy
from zeroth_pg.testing import libpq_dsn, psql_executable

ENQUEUE_RUN = "zeroth.enqueue_run(text, jsonb, text, text, integer, timestamptz, integer, text, "\
              "jsonb, uuid, text, integer, integer)"  # since 0021: a run's own timeouts


async def registry(pool) -> dict[str, tuple[int, int, str]]:
    rows = await pool.fetch("SELECT deployment_ref, max_attempts, priority, managed_by "
                            "FROM zeroth.deployments")
    return {r["deployment_ref"]: (r["max_attempts"], r["priority"], r["managed_by"]) for r in rows}


async def run_values(pool, run_id) -> tuple[int, int]:
    row = await pool.fetchrow("SELECT max_attempts, priority FROM zeroth.runs WHERE run_id = $1",
                              run_id)
    return row["max_attempts"], row["priority"]


def declare(app: App, name: str, max_attempts: int, priority: int = 0) -> None:
    @app.deployment(name, max_attempts=max_attempts, priority=priority)
    async def handler(run) -> None:
        return None


class TestAppRegistersItsDeployments:
    async def test_opening_the_app_registers_every_deployment(self, app, pool):
        declare(app, "send-email", 4, 2)
        declare(app, "resize", 7)
        await app.open()
        assert await registry(pool) == {"send-email": (4, 2, "app"), "resize": (7, 0, "app")}

    async def test_a_run_enqueued_from_psql_without_max_attempts_gets_the_registered_value(
            self, app, pool, database_dsn):
        declare(app, "send-email", 4, 2)
        await app.open()
        done = await asyncio.to_thread(
            subprocess.run,
            [psql_executable(), libpq_dsn(database_dsn), "-X", "-At", "-v", "ON_ERROR_STOP=1",
             "-c", "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'send-email', "
                   "payload => '{\"to\": \"a@b\"}')"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert await run_values(pool, done.stdout.strip()) == (4, 2)

    async def test_a_second_app_with_other_values_wins_with_an_audit_row_and_a_warning(
            self, app, pool, database_dsn, caplog):
        declare(app, "send-email", 4)
        await app.open()
        second = App(database_dsn, pool=pool)
        declare(second, "send-email", 6)
        with caplog.at_level(logging.WARNING, logger="zeroth_pg.app"):
            results = await second.register_deployments()
        assert [(r.outcome, r.max_attempts, r.previous) for r in results] == [
            ("updated", 6, {"max_attempts": 4, "priority": 0, "managed_by": "app"})]
        assert any("send-email" in r.getMessage() and "max_attempts=6" in r.getMessage()
                   for r in caplog.records)
        changes = await pool.fetch(
            "SELECT version, old_values::text AS old, new_values::text AS new "
            "FROM zeroth.deployment_changes WHERE deployment_ref = 'send-email' ORDER BY version")
        assert [(c["version"], c["old"] and json.loads(c["old"])["max_attempts"],
                 json.loads(c["new"])["max_attempts"]) for c in changes] == [
            (1, None, 4), (2, 4, 6)]

    async def test_the_apps_enqueue_gets_what_a_dba_set_and_an_explicit_value_wins(
            self, app, pool):
        declare(app, "send-email", 4, 2)
        await LeaseManager(pool).set_deployment_defaults("send-email", max_attempts=9)
        await app.open()
        results = await app.register_deployments()
        assert [(r.outcome, r.max_attempts, r.priority) for r in results] == [("kept", 9, 0)]
        deployment = app.deployments["send-email"]
        run = await deployment.enqueue()
        assert await run_values(pool, run.run_id) == (9, 0)
        explicit = await deployment.enqueue(max_attempts=1, priority=5)
        assert await run_values(pool, explicit.run_id) == (1, 5)
        many = await deployment.enqueue_many([{}, {}])
        assert [await run_values(pool, r.run_id) for r in many] == [(9, 0), (9, 0)]

    async def test_registering_twice_changes_nothing(self, app, pool):
        declare(app, "send-email", 4, 2)
        await app.open()
        again = await app.register_deployments()
        assert [(r.outcome, r.version) for r in again] == [("unchanged", 1)]
        assert await pool.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == 1

    async def test_an_enqueue_in_the_callers_transaction_sends_the_declared_values_until_registered(
            self, app, pool):
        # The App never opened its pool: it has registered nothing and sends what it declared.
        declare(app, "send-email", 4, 2)
        async with pool.acquire() as conn, conn.transaction():
            run = await app.deployments["send-email"].enqueue(conn=conn)
        assert await run_values(pool, run.run_id) == (4, 2)
        assert await registry(pool) == {}

    async def test_an_app_whose_role_may_not_register_sends_its_declared_values(
            self, pool, database_dsn, caplog):
        with login_role(database_dsn, None) as (name, password):
            await pool.execute(f'GRANT USAGE ON SCHEMA zeroth TO "{name}"')
            await pool.execute(f'GRANT EXECUTE ON FUNCTION {ENQUEUE_RUN} TO "{name}"')
            limited = App(dsn_as(database_dsn, name, password), pool_size=2)
            declare(limited, "send-email", 4, 2)
            try:
                with caplog.at_level(logging.WARNING, logger="zeroth_pg.app"):
                    first = await limited.deployments["send-email"].enqueue()
                    second = await limited.deployments["send-email"].enqueue()
            finally:
                await limited.close()
        assert [await run_values(pool, r.run_id) for r in (first, second)] == [(4, 2), (4, 2)]
        assert await registry(pool) == {}
        warned = [r for r in caplog.records if "could not register" in r.getMessage()]
        assert len(warned) == 1  # once, not on every enqueue


class TestRetryPolicyAndLease:
    """``@app.deployment(retry=..., lease_seconds=...)`` registers them (zeroth.deployments), so a
    worker in any language that passes none gets them; the App's worker, configured with no
    retry policy of its own, leaves the backoff to the registry (a DBA's change included)."""

    async def test_the_app_registers_its_deployments_retry_policy_and_lease(self, app, pool):
        @app.deployment("send-email", retry=RetryPolicy(5, 60), lease_seconds=120)
        async def send(run) -> None:
            return None

        @app.deployment("resize")
        async def resize(run) -> None:
            return None

        await app.open()
        rows = await pool.fetch("SELECT deployment_ref, retry_base_seconds, retry_max_seconds, "
                                "lease_seconds FROM zeroth.deployments ORDER BY 1")
        assert [tuple(r) for r in rows] == [("resize", None, None, None),
                                            ("send-email", 5, 60, 120)]
        listed = await LeaseManager(pool).list_deployments("send-email")
        assert (listed[0].retry_base_seconds, listed[0].retry_max_seconds,
                listed[0].lease_seconds) == (5, 60, 120)
        worker = await app.worker()
        assert worker.lease_duration == 120  # the longest lease_seconds of those it serves
        assert (await app.worker(["resize"])).lease_duration == app.lease_duration

    def test_a_bad_lease_is_refused_when_declared(self, app):
        for bad in (0, 1e-9, 0.5, -1, 86401, float("nan"), True, "60"):
            with pytest.raises(ValueError, match="lease_seconds"):
                app.deployment(f"d{bad!s}", lease_seconds=bad)(lambda run: None)

    async def test_a_worker_without_a_policy_retries_with_the_registered_one(
            self, app, pool, serve):
        @app.deployment("flaky", max_attempts=3)
        async def flaky(run) -> None:
            raise RuntimeError("downstream is down")

        await app.open()
        # A DBA backs the deployment off to a 1000 s base: the worker names no policy, so its
        # next failure is retried 500-1000 s later (1 / 300 s before the change).
        await LeaseManager(pool).set_deployment_defaults("flaky", retry_base_seconds=1000,
                                                         retry_max_seconds=5000)
        run = await app.deployments["flaky"].enqueue()
        await serve("flaky")

        async def retried() -> asyncpg.Record | None:
            row = await pool.fetchrow("SELECT status::text, run_after, updated_at, error FROM "
                                      "zeroth.runs WHERE run_id = $1", run.run_id)
            return row if row["status"] == "pending" and row["error"] is not None else None

        row = await wait_until(retried, "the failed attempt's retry", within=30)
        delay = (row["run_after"] - row["updated_at"]).total_seconds()
        assert 500 <= delay <= 1000
