"""Schedules from Python on the real database clock (no test clock): the LeaseManager methods,
``@app.periodic`` registered when the worker starts, a DBA's pause that survives a restart, the
catch-up policy after a ten-second outage, and three workers firing one schedule every second
for twenty seconds without a double or a gap."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from itertools import pairwise

import pytest
from helpers import wait_until

from zeroth_pg import (
    App,
    InvalidArgumentError,
    InvalidScopeError,
    LeaseManager,
    ScheduleNotFoundError,
)


class TestLeaseManager:
    async def test_manage_a_schedule_end_to_end(self, pool):
        lm = LeaseManager(pool)
        created = await lm.create_schedule("nightly", "d", cron="0 3 * * *",
                                           time_zone="Europe/Berlin", payload={"k": 1},
                                           tenant_id="acme")
        assert (created.cron, created.time_zone, created.payload) == (
            "0 3 * * *", "Europe/Berlin", {"k": 1})
        altered = await lm.alter_schedule("nightly", tenant_id="acme", cron="30 4 * * *")
        assert altered.next_fire_at != created.next_fire_at
        assert (await lm.pause_schedule("nightly", tenant_id="acme")).paused
        assert not (await lm.resume_schedule("nightly", tenant_id="acme")).paused
        assert [s.name for s in await lm.list_schedules(tenant_id="acme")] == ["nightly"]
        assert await lm.list_schedules() == []
        assert await lm.delete_schedule("nightly", tenant_id="acme") == created.schedule_id

    async def test_errors_are_typed(self, pool):
        lm = LeaseManager(pool)
        with pytest.raises(ScheduleNotFoundError):
            await lm.pause_schedule("missing")
        with pytest.raises(InvalidArgumentError, match="cron hour: 25 is out of range"):
            await lm.create_schedule("s", "d", cron="0 25 * * *")
        with pytest.raises(InvalidScopeError):
            await lm.create_schedule("s", "d", cron="0 1 * * *", workspace_id="w")

    async def test_catch_up_after_a_ten_second_outage_fires_exactly_its_limit(self, pool):
        lm = LeaseManager(pool)
        await lm.create_schedule("tick", "d", interval_seconds=1, missed_fire_policy="catch_up",
                                 catch_up_limit=3)
        await asyncio.sleep(10)  # no firer running: about ten fire times pass
        result = await lm.fire_due_schedules(["d"])
        assert len(result.fires) == 3
        times = [f.fire_at for f in result.fires]
        assert [b - a for a, b in pairwise(times)] == [timedelta(seconds=1)] * 2
        assert all(f.skipped >= 5 for f in result.fires)
        assert result.next_due_at == times[-1] + timedelta(seconds=1)
        again = await lm.fire_due_schedules(["d"])
        assert all(f.fire_at > times[-1] for f in again.fires)


class TestPeriodic:
    async def test_a_periodic_deployment_runs_on_its_schedule(self, app: App, serve, pool):
        seen: list[dict[str, object]] = []

        @app.periodic(interval_seconds=1, payload={"kind": "tick"})
        @app.deployment("ticker")
        async def ticker(run, kind: str) -> dict[str, str]:
            seen.append({"kind": kind, "fire_at": run.metadata["zeroth_schedule"]["fire_at"]})
            return {"ok": kind}

        await serve("ticker")
        await wait_until(lambda: len(seen) >= 2, "two scheduled runs", within=30)
        assert {s["kind"] for s in seen} == {"tick"}
        row = await pool.fetchrow("SELECT managed_by, fire_count FROM zeroth.schedules")
        assert row["managed_by"] == "app"
        assert row["fire_count"] >= 2

    def test_a_payload_that_does_not_fit_the_handler_is_refused_at_declaration(self, app: App):
        @app.deployment("typed")
        async def typed(run, n: int) -> None: ...

        with pytest.raises(InvalidArgumentError, match="n: expected an integer"):
            app.periodic(cron="* * * * *", payload={"n": "x"})(typed)
        with pytest.raises(ValueError, match="exactly one of cron and interval_seconds"):
            app.periodic()

    async def test_a_dba_pause_survives_a_worker_restart(self, app: App, serve, pool):
        @app.periodic(cron="* * * * *")
        @app.deployment("paused-job")
        async def paused_job(run) -> None: ...

        worker = await serve("paused-job")
        await worker.graceful_shutdown()
        await LeaseManager(pool).pause_schedule("paused-job")
        await serve("paused-job")
        assert await pool.fetchval("SELECT paused FROM zeroth.schedules") is True


class TestThreeWorkers:
    @pytest.mark.slow  # twenty seconds of the real clock
    async def test_every_second_for_twenty_seconds_fires_each_second_once(self, app: App, serve,
                                                                       pool):
        ran: Counter[str] = Counter()

        @app.periodic(interval_seconds=1, missed_fire_policy="catch_up", catch_up_limit=100)
        @app.deployment("every-second")
        async def every_second(run) -> None:
            ran[run.metadata["zeroth_schedule"]["fire_at"]] += 1

        workers = [await serve("every-second", worker_id=f"w{i}") for i in range(3)]
        await asyncio.sleep(20)
        for worker in workers:
            await worker.graceful_shutdown()

        rows = await pool.fetch(
            """SELECT (metadata -> 'zeroth_schedule' ->> 'fire_at')::timestamptz AS fire_at,
                      status::text AS status
                 FROM zeroth.runs ORDER BY 1""")
        times = [r["fire_at"] for r in rows]
        assert len(times) == len(set(times))  # never two runs for one fire time
        steps = {b - a for a, b in pairwise(times)}
        assert steps == {timedelta(seconds=1)}  # and no fire time left out
        fires = await pool.fetch("SELECT fire_at, run_id FROM zeroth.schedule_fires ORDER BY 1")
        assert [f["fire_at"] for f in fires] == times
        assert await pool.fetchval("SELECT fire_count FROM zeroth.schedules") == len(times)
        # Each handler ran once per fire time (no crash here, so at-least-once is exactly once).
        assert set(ran.values()) <= {1}
        assert sum(1 for r in rows if r["status"] == "completed") == sum(ran.values())
        # Each worker counts the fires it saw created: all of them but, per worker, at most the
        # one whose call its shutdown cancelled after the commit (its outcome unknown to it; the
        # database's counts above are the truth, and hold exactly).
        counted = sum(w._firer.fired for w in workers if w._firer)
        assert len(times) - len(workers) <= counted <= len(times)
