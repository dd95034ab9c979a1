"""Schedule precision: how late a fire time becomes a run, and how late its handler starts.

``python -m bench.schedule_precision --dsn postgresql://... [--seconds 60] [--workers 1]``

A schedule firing every second (catch_up, so no fire time is dropped) is served by ``--workers``
ordinary RunWorkers of one App (schedule task capped at 1 s sleeps, default poll settings). Both
delays are read from the database clock, so no client clock enters them: ``enqueued`` is
runs.created_at - fire time (fire time → run enqueued), ``started`` is runs.started_at - fire
time (fire time → handler start, claim_and_start included). Prints p50/p95/p99/max in ms as JSON.
The database must be migrated; the script uses a fresh deployment name and deletes its schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import uuid

import asyncpg

from zeroth_pg import App, LeaseManager


def _summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)

    def q(p: float) -> float:
        return round(values[min(len(values) - 1, int(p * len(values)))], 1)

    return {"n": len(values), "p50": q(0.50), "p95": q(0.95), "p99": q(0.99),
            "max": round(values[-1], 1), "mean": round(statistics.fmean(values), 1)}


async def main(dsn: str, seconds: float, workers: int) -> dict[str, object]:
    deployment = f"precision-{uuid.uuid4().hex[:8]}"
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8 * workers)
    app = App(dsn, pool=pool)

    @app.periodic(interval_seconds=1, missed_fire_policy="catch_up", catch_up_limit=100)
    @app.deployment(deployment)
    async def tick(run) -> None:
        return None

    started = [await app.worker([deployment], worker_id=f"{deployment}-{i}")
               for i in range(workers)]
    for worker in started:
        await worker.start()
    await asyncio.sleep(seconds)
    for worker in started:
        await worker.graceful_shutdown()
    rows = await pool.fetch(
        """SELECT extract(epoch FROM r.created_at - f.fire_at) * 1000 AS enqueued,
                  extract(epoch FROM r.started_at - f.fire_at) * 1000 AS started
             FROM zeroth.schedule_fires f JOIN zeroth.runs r ON r.run_id = f.run_id
            WHERE r.deployment_ref = $1 AND r.started_at IS NOT NULL""", deployment)
    await LeaseManager(pool).delete_schedule(deployment)
    await pool.close()
    return {"deployment": deployment, "workers": workers, "seconds": seconds,
            "enqueued_ms": _summary([float(r["enqueued"]) for r in rows]),
            "started_ms": _summary([float(r["started"]) for r in rows])}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.dsn, args.seconds, args.workers))))
