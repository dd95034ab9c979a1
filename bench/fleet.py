"""One worker for many tenants (issue 14): fairness under a flood, weights, and what known but
idle scopes cost a claim.

* **fairness** — tenant ``big`` has a backlog of B runs (full: 50,000), tenant ``small`` gets 10
  runs/s from a producer while one fleet worker (zeroth_pg ``RunWorker({deployment: handler})``,
  8 slots, 1 ms handler) drains the backlog. Measured: the small tenant's pickup (its enqueue
  committed → its handler started) p50/p99/max, and the backlog's drain rate. The same workload
  through pgqueuer (one FIFO queue, as every peer has: no tenants) is the "without the fairness
  rule" column: there a small run waits behind everything enqueued before it.
* **weights** — tenants ``heavy`` (weight 3 in zeroth.scope_limits) and ``light`` (weight 1),
  both backlogged; the fleet worker runs for a few seconds; the share each got.
* **scope cost** — the time of one ``claim_and_start_scopes`` (every scope, batch 8) with 10
  scopes holding pending runs, when the database knows 10 scopes and when it knows 10,000 more
  (each with finished runs and a zeroth.scope_limits row): the ratio, from medians of the same
  run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from datetime import timedelta
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench.harness import Config, Result, ScenarioReport, Target, percentile, pool, wait_until
from zeroth_pg import LeaseManager
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.worker import RunWorker

DEPLOYMENT = "fleet"
SMALL_RATE = 10.0
HANDLER_SECONDS = 0.001
SLOTS = 8


async def _fill(dsn: str, tenant: str, n: int, deployment: str = DEPLOYMENT) -> None:
    lm = LeaseManager(await asyncpg.create_pool(dsn, min_size=1, max_size=1))
    try:
        for start in range(0, n, 5000):
            await lm.enqueue_runs(deployment, [{"payload": {"i": i}}
                                               for i in range(start, min(n, start + 5000))],
                                  tenant_id=tenant)
    finally:
        await lm.pool.close()


async def _small_producer(enqueue: Any, seconds: float, acked: dict[int, float]) -> None:
    t0 = time.perf_counter()
    sent = 0
    while (elapsed := time.perf_counter() - t0) < seconds:
        if int(elapsed * SMALL_RATE) > sent:
            await enqueue(sent)
            acked[sent] = time.perf_counter()
            sent += 1
        await asyncio.sleep(0.01)


async def zeroth_fairness(server: Any, backlog: int, seconds: float) -> dict[str, Any]:
    dsn = await asyncio.to_thread(server.zeroth_database, "fleet_fair")
    await _fill(dsn, "big", backlog)
    started: dict[int, float] = {}
    big_done = 0

    async def handler(run: Any) -> None:
        nonlocal big_done
        if run.scope.tenant_id == "small":
            started.setdefault(run.payload["n"], time.perf_counter())
        else:
            big_done += 1
        await asyncio.sleep(HANDLER_SECONDS)

    acked: dict[int, float] = {}
    async with pool(dsn, SLOTS + 4) as workers, pool(dsn, 1) as producers:
        lm = LeaseManager(producers)
        worker = RunWorker(workers, {DEPLOYMENT: handler}, dsn=dsn, max_concurrency=SLOTS,
                           lease_duration=30.0, metrics=WorkerMetrics.create(CollectorRegistry()))
        await worker.start()
        try:
            await asyncio.sleep(1.0)  # under full load before the small tenant starts
            t0, done0 = time.perf_counter(), big_done
            await _small_producer(
                lambda n: lm.enqueue_run(DEPLOYMENT, {"n": n}, tenant_id="small"), seconds, acked)
            rate = (big_done - done0) / (time.perf_counter() - t0)
            with contextlib.suppress(TimeoutError):
                await wait_until(lambda: len(started) >= len(acked), limit=30,
                                 what="the small tenant's runs")
        finally:
            await worker.graceful_shutdown()
    return {"pickups": [1000 * (started[n] - t) for n, t in acked.items() if n in started],
            "sent": len(acked), "started": len(started), "backlog_rate": rate}


async def pgqueuer_fairness(system: Any, backlog: int, seconds: float) -> dict[str, Any]:
    from pgqueuer import AsyncpgPoolDriver, Queries
    from pgqueuer import PgQueuer as PgQ

    await system.reset()
    producer_pool = await asyncpg.create_pool(system.dsn, min_size=1, max_size=1)
    queries = Queries(AsyncpgPoolDriver(producer_pool))
    for start in range(0, backlog, 5000):
        size = min(5000, backlog - start)
        await queries.enqueue(["job"] * size, [b"big"] * size, [0] * size)
    started: dict[int, float] = {}
    big_done = 0

    async def handler(job: Any) -> None:
        nonlocal big_done
        text = job.payload.decode()
        if text == "big":
            big_done += 1
        else:
            started.setdefault(int(text), time.perf_counter())
        await asyncio.sleep(HANDLER_SECONDS)

    conn = await asyncpg.connect(system.dsn)
    pgq = PgQ.from_asyncpg_connection(conn)
    pgq.entrypoint("job")(handler)
    task = asyncio.create_task(pgq.run(batch_size=4, max_concurrent_tasks=SLOTS,
                                       dequeue_timeout=timedelta(seconds=30)))
    acked: dict[int, float] = {}
    try:
        await asyncio.sleep(1.0)
        t0, done0 = time.perf_counter(), big_done
        await _small_producer(
            lambda n: queries.enqueue(["job"], [str(n).encode()], [0]), seconds, acked)
        rate = (big_done - done0) / (time.perf_counter() - t0)
    finally:
        pgq.shutdown.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        await conn.close()
        await producer_pool.close()
    return {"pickups": [1000 * (started[n] - t) for n, t in acked.items() if n in started],
            "sent": len(acked), "started": len(started), "backlog_rate": rate}


async def weights(server: Any, seconds: float, backlog: int = 20_000) -> dict[str, int]:
    dsn = await asyncio.to_thread(server.zeroth_database, "fleet_weights")
    for tenant in ("heavy", "light"):
        await _fill(dsn, tenant, backlog)
    setup = await asyncpg.connect(dsn)
    try:
        await setup.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, weight) "
                            "VALUES ('heavy', $1, 3)", DEPLOYMENT)
    finally:
        await setup.close()
    served = {"heavy": 0, "light": 0}

    async def handler(run: Any) -> None:
        served[run.scope.tenant_id] += 1
        await asyncio.sleep(HANDLER_SECONDS)

    async with pool(dsn, SLOTS + 4) as workers:
        worker = RunWorker(workers, {DEPLOYMENT: handler}, dsn=dsn, max_concurrency=SLOTS,
                           lease_duration=30.0, metrics=WorkerMetrics.create(CollectorRegistry()))
        await worker.start()
        try:
            await asyncio.sleep(seconds)
        finally:
            await worker.graceful_shutdown()
    return served


async def claim_cost(server: Any, known: int, calls: int, pending: int = 5000) -> float:
    """Median ms of one claim_and_start_scopes (every scope, batch 8) with 10 scopes holding
    ``pending`` runs each and ``known`` more scopes that have only finished runs and a limits
    row."""
    dsn = await asyncio.to_thread(server.zeroth_database, f"fleet_cost{known}")
    conn = await asyncpg.connect(dsn)
    try:
        if known:
            await conn.execute(
                """INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, weight)
                   SELECT 'idle-' || g, $1, 1 + g % 3 FROM generate_series(1, $2) g""",
                DEPLOYMENT, known)
            for start in range(0, known, 2000):
                await conn.fetchval(
                    """SELECT count(*) FROM generate_series($3::int, $4::int) g
                         CROSS JOIN LATERAL zeroth.enqueue_runs(
                             deployment_ref => $1, runs => $2::text::jsonb,
                             tenant_id => 'idle-' || g) e""",
                    DEPLOYMENT, json.dumps([{"payload": {}}]), start + 1,
                    min(known, start + 2000))
            # Drain them: the scopes stay known (finished runs, limits rows), none is active.
            while await conn.fetchval(
                    """SELECT count(*) FROM zeroth.claim_and_start_scopes(
                           deployment_refs => ARRAY[$1], worker_id => 'setup',
                           batch_size => 1000)""", DEPLOYMENT):
                await conn.fetchval(
                    """SELECT count(*) FROM (SELECT tenant_id, array_agg(run_id) AS ids,
                                                    array_agg(lease_generation) AS gens
                                               FROM zeroth.runs WHERE status = 'running'
                                              GROUP BY tenant_id) x
                         CROSS JOIN LATERAL zeroth.complete_runs(
                             worker_id => 'setup', run_ids => x.ids, generations => x.gens,
                             tenant_id => x.tenant_id) c""")
        for i in range(10):
            await _fill(dsn, f"active-{i}", pending)
        await conn.execute("VACUUM ANALYZE zeroth.runs")
        samples = []
        for _ in range(calls):
            transaction = conn.transaction()  # rolled back: the backlogs stay as they were
            await transaction.start()
            t = time.perf_counter()
            await conn.fetch("""SELECT run_id FROM zeroth.claim_and_start_scopes(
                deployment_refs => ARRAY[$1], worker_id => 'w', batch_size => 8)""", DEPLOYMENT)
            samples.append(1000 * (time.perf_counter() - t))
            await transaction.rollback()
        return statistics.median(samples)
    finally:
        await conn.close()


async def fleet(cfg: Config, s: Any) -> ScenarioReport:
    backlog, seconds = (500, 2.0) if cfg.quick else (50_000, 20.0)
    rep = ScenarioReport("fleet", f"One worker for many tenants: a small tenant's pickup behind "
                         f"a {backlog:,}-run backlog of another, weights, and the cost of known "
                         "but idle scopes")
    lines = ["| system | small tenant pickup p50 / p99 / max ms | started | backlog drained "
             "runs/s |", "|---|---|---|---|"]
    for name, measure in (("zeroth-worker (fleet, fair)",
                           lambda: zeroth_fairness(s.zeroth.server, backlog, seconds)),
                          ("pgqueuer (one FIFO queue)",
                           lambda: pgqueuer_fairness(s.pgqueuer, backlog, seconds))):
        found = await measure()
        pickups = found["pickups"]
        for q in (50, 99):
            rep.results.append(Result(rep.name, name, f"small_pickup_p{q}", "ms",
                                      (percentile(pickups, q),), {"backlog": backlog},
                                      higher_is_better=False,
                                      extra={"sent": found["sent"], "started": found["started"]}))
        rep.results.append(Result(rep.name, name, "backlog_rate", "runs/s",
                                  (found["backlog_rate"],), {"backlog": backlog}))
        lines.append(f"| {name} | {percentile(pickups, 50):.1f} / {percentile(pickups, 99):.1f}"
                     f" / {max(pickups, default=float('nan')):.0f} | {found['started']} of "
                     f"{found['sent']} | {found['backlog_rate']:.0f} |")
        print(lines[-1], flush=True)
        if name.startswith("zeroth"):
            p99 = percentile(pickups, 99)
            rep.targets.append(Target(
                f"fairness: the small tenant's runs start within a bounded wait behind a "
                f"{backlog:,}-run backlog (p99 ≤ 1 s)", f"p99 {p99:.1f} ms, "
                f"{found['started']} of {found['sent']} started", p99 <= 1000
                and found["started"] == found["sent"]))
    rep.tables.append("\n".join(lines))

    served = await (weights(s.zeroth.server, 1.5, 3_000) if cfg.quick
                    else weights(s.zeroth.server, 10.0))
    share = served["heavy"] / max(1, served["heavy"] + served["light"])
    rep.results.append(Result(rep.name, "zeroth-worker", "heavy_share", "fraction", (share,),
                              {"weights": "3:1"}, extra=served))
    rep.tables.append("| weights heavy:light | runs served heavy / light | heavy's share "
                      "(expected 0.75) |\n|---|---|---|\n"
                      f"| 3:1 | {served['heavy']} / {served['light']} | {share:.3f} |")
    rep.targets.append(Target("weights: a weight-3 scope gets 0.75 ± 0.05 of a shared backlog",
                              f"{share:.3f}", abs(share - 0.75) <= 0.05))

    calls = 20 if cfg.quick else 500
    known = 200 if cfg.quick else 10_000
    pending = 200 if cfg.quick else 5_000
    few, many = (await claim_cost(s.zeroth.server, 0, calls, pending),
                 await claim_cost(s.zeroth.server, known, calls, pending))
    for label, value in (("10 known", few), (f"{known:,} more known", many)):
        rep.results.append(Result(rep.name, "zeroth", "claim_ms", "ms", (value,),
                                  {"known": label}, higher_is_better=False))
    rep.tables.append("| scopes known (10 active) | claim_and_start_scopes median ms |\n"
                      f"|---|---|\n| 10 | {few:.3f} |\n| 10 + {known:,} idle | {many:.3f} |")
    rep.targets.append(Target(
        f"claim with {known:,} known and 10 active within noise (≤ 1.25×) of 10 known and 10 "
        "active", f"{many / few:.2f}×", many / few <= 1.25))
    rep.notes.append(
        "The fleet worker claims with zeroth.claim_and_start_scopes over every scope of its "
        "deployment: the scopes with due work are visited in a weighted random order and each "
        "first gets its share of the free slots. pgqueuer has one queue per entrypoint and no "
        "tenants: the small runs join the end of the backlog. The scope-cost databases have "
        f"10 scopes with {pending:,} pending runs each; the idle scopes had one run each, "
        "claimed and completed, and have a zeroth.scope_limits row. Every timed claim is "
        "rolled back.")
    return rep
