"""Run event streams (issue 34, item 1): what ``append_run_event`` sustains and how soon a
subscriber sees an event, against the NOTIFY-off control (``notify => false``: the subscriber
finds events by its poll alone), on the suite's durable server.

* one run — one session appends events to one running run, each call its own transaction
  (events/s);
* many runs — ``runs`` running runs (1,000 in the full suite), ``sessions`` sessions appending to
  them round-robin for a fixed time (events/s across all of them);
* latency — a subscriber (``LeaseManager.stream``, poll interval 1 s) follows one run while an
  appender appends an event every ``gap`` seconds: the time from the append's call (its commit
  included) to the subscriber yielding that event, p50 and p99 (one process, one clock).

Every cell runs on the zeroth database of the suite; the runs are claimed once by a bare
``claim_and_start`` and never finished, and the database is emptied before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any
from uuid import UUID

import asyncpg

from bench.harness import Config, Result, ScenarioReport, interleave, percentile
from bench.harness import pool as bench_pool
from zeroth_pg import LeaseManager

DEPLOYMENT = "streams"
WORKER = "bench-streams"
APPEND = """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2, generation => $3,
    name => 'token', data => $4::text::jsonb, notify => $5)"""
DATA = '{"text": "a token of about this size"}'


async def _running(lm: LeaseManager, conn: asyncpg.Connection, n: int) -> list[tuple[UUID, int]]:
    await conn.execute(
        """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, runs => (
               SELECT jsonb_agg(jsonb_build_object('payload', '{}'::jsonb))
                 FROM generate_series(1, $2)))""", DEPLOYMENT, n)
    leases: list[tuple[UUID, int]] = []
    while len(leases) < n:
        claimed = await lm.claim_and_start(DEPLOYMENT, WORKER,
                                           batch_size=min(1000, n - len(leases)))
        if not claimed.runs:
            raise RuntimeError("the runs to stream into could not be claimed")
        leases += [(r.run_id, r.lease_generation) for r in claimed.runs]
    return leases


async def _reset(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE zeroth.runs, zeroth.admission_slots CASCADE")


async def streams(cfg: Config, s: Any) -> ScenarioReport:
    dsn = s.zeroth.dsn
    per_run_events = 200 if cfg.quick else 5_000
    many_runs = 20 if cfg.quick else 1_000
    sessions = 4 if cfg.quick else 16
    seconds = 0.5 if cfg.quick else 5.0
    latency_events = 20 if cfg.quick else 500
    gap = 0.01 if cfg.quick else 0.02
    rep = ScenarioReport("streams", f"Run event streams: append_run_event per run and across "
                         f"{many_runs} running runs ({sessions} sessions), append → subscriber "
                         "latency; NOTIFY on vs off")
    admin = await asyncpg.connect(dsn)
    try:
        async with bench_pool(dsn, sessions + 2) as pool:
            lm = LeaseManager(pool, lease_duration_seconds=3600)

            def one_run(notify: bool) -> Any:
                async def measure() -> float:
                    await _reset(admin)
                    ((run_id, generation),) = await _running(lm, admin, 1)
                    async with pool.acquire() as conn:
                        started = time.perf_counter()
                        for _ in range(per_run_events):
                            await conn.fetchval(APPEND, run_id, WORKER, generation, DATA, notify)
                        return per_run_events / (time.perf_counter() - started)
                return measure

            def many(notify: bool) -> Any:
                async def measure() -> float:
                    await _reset(admin)
                    leases = await _running(lm, admin, many_runs)
                    count = [0]
                    stop = time.perf_counter() + seconds

                    async def appender(k: int) -> None:
                        async with pool.acquire() as conn:
                            i = k
                            while time.perf_counter() < stop:
                                run_id, generation = leases[i % len(leases)]
                                await conn.fetchval(APPEND, run_id, WORKER, generation, DATA,
                                                    notify)
                                count[0] += 1
                                i += sessions
                    started = time.perf_counter()
                    await asyncio.gather(*(appender(k) for k in range(sessions)))
                    return count[0] / (time.perf_counter() - started)
                return measure

            rates = await interleave(
                [("one run, NOTIFY", one_run(True)), ("one run, NOTIFY off", one_run(False)),
                 (f"{many_runs} runs, NOTIFY", many(True)),
                 (f"{many_runs} runs, NOTIFY off", many(False))], cfg.repeat)
            for label, values in rates.items():
                rep.results.append(Result(rep.name, "zeroth", label, "events/s", tuple(values),
                                          {"sessions": 1 if "one run" in label else sessions}))

            latencies: dict[bool, list[float]] = {}
            for notify in (True, False):
                await _reset(admin)
                ((run_id, generation),) = await _running(lm, admin, 1)
                appended: dict[int, float] = {}
                seen: list[float] = []

                async def follow(run: UUID = run_id, appended: dict[int, float] = appended,
                                 seen: list[float] = seen) -> None:
                    async for event in lm.stream(run, poll_interval=1.0):
                        if event.is_end:
                            return
                        seen.append(time.perf_counter() - appended[event.event_id])
                        if len(seen) == latency_events:
                            return

                task = asyncio.create_task(follow())
                try:
                    async with pool.acquire() as conn:
                        await asyncio.sleep(0.2)  # the subscriber's LISTEN and first read
                        for n in range(1, latency_events + 1):
                            # Keyed by the number the append will get (the only appender): the
                            # subscriber may see it before this coroutine resumes.
                            appended[n] = time.perf_counter()
                            assert await conn.fetchval(APPEND, run_id, WORKER, generation,
                                                       DATA, notify) == n
                            await asyncio.sleep(gap)
                    await asyncio.wait_for(task, 60)
                finally:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                latencies[notify] = [v * 1000 for v in seen]
            for notify, values in latencies.items():
                label = "append → subscriber" + ("" if notify else ", NOTIFY off (poll 1 s)")
                rep.results.append(Result(rep.name, "zeroth", label, "ms", tuple(values),
                                          {"notify": notify}, higher_is_better=False,
                                          extra={"p50": percentile(values, 50),
                                                 "p99": percentile(values, 99)}))
    finally:
        with contextlib.suppress(Exception):
            await _reset(admin)
        await admin.close()

    lines = ["| cell | median [min–max] |", "|---|---|"]
    for r in rep.results:
        if r.unit == "events/s":
            lines.append(f"| {r.metric} | {r.median:,.0f} [{r.low:,.0f}–{r.high:,.0f}] events/s |")
        else:
            lines.append(f"| {r.metric} | p50 {r.extra['p50']:.1f} ms, p99 {r.extra['p99']:.1f} "
                         "ms |")
    rep.tables.append("\n".join(lines))
    rep.notes.append(
        "Each append is one call of zeroth.append_run_event in its own transaction (a durable "
        "commit each). NOTIFY on: every append notifies zeroth_run_events with the run's key, "
        "and a notifying commit serialises on PostgreSQL's notification lock; off: notify => "
        "false, the subscriber reads on its 1 s poll. Latency is from the append's call (its "
        "commit included) to the subscriber yielding the event, in one process.")
    return rep
