"""Production pressure (issue 13, item 6): each system's drain rate and pickup latency while
the server is kept from cleaning up after it.

For each system, on its own database, four phases back to back (the queue emptied once before
the first; finished rows and dead tuples carry over, as they would in production):

* ``clean`` — nothing else running;
* ``holder`` — one other session of the system's database holds a transaction open with an XID
  (``BEGIN; SELECT txid_current();`` then idle) for the whole phase: the xmin horizon is pinned,
  so no dead tuple of the phase can be pruned or vacuumed and no index entry killed;
* ``readers`` — four REPEATABLE READ readers loop ``SELECT count(*)`` over the system's jobs
  table (a scan, then 10 ms idle) in transactions of a few seconds, staggered: the horizon moves
  but always lags by up to one reader transaction;
* ``after`` — the pressure released, measured at once (no VACUUM): what is left to clean up.

In each phase: n no-op runs enqueued (not timed) and drained at one concurrency (runs/s), then
the system's wakeup-latency probe (:meth:`bench.systems.System.latency`: an idle consumer, runs
enqueued one by one by a producer process, enqueue commit → handler start), and the jobs table's
``pg_total_relation_size`` (table + indexes + TOAST) and that of all the database's tables at
the phase's start and end. zeroth-lease has no consumer of its own, so no probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from bench import drains as drains_mod
from bench import report
from bench.harness import Config, Result, ScenarioReport, Target, percentile

PHASES = ("clean", "holder", "readers", "after")
READERS = 4
READER_PAUSE = 0.01
HOLDER_P99_LIMIT = 2.0  # × clean
COLLAPSE = 0.5  # holder throughput below this share of clean counts as a collapse

_SIZES = """SELECT pg_total_relation_size($1::regclass) AS jobs,
                   (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
                      FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
                     WHERE c.relkind IN ('r', 'm')
                       AND ns.nspname NOT IN ('pg_catalog', 'information_schema')
                       AND ns.nspname NOT LIKE 'pg_toast%') AS all_tables"""


def sizes(cfg: Config) -> dict[str, Any]:
    """Per-phase runs, drain concurrency, probe runs, reader transaction seconds, repeats."""
    if cfg.quick:
        # probe_all False: only zeroth-worker's wakeup probe runs (each probe starts a producer
        # process; the peers' probes are smoked by the latency scenario).
        return {"runs": 60, "concurrency": 4, "probe": 5, "gap": 0.02, "reader_tx": 0.5,
                "repeat": 1, "probe_all": False}
    return {"runs": 3_000, "concurrency": 8, "probe": 100, "gap": 0.02, "reader_tx": 3.0,
            "repeat": min(cfg.repeat, 2), "probe_all": True}


async def _reader(dsn: str, table: str, first: float, hold: float, stop: asyncio.Event,
                  started: asyncio.Event, scans: list[float]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        length = first
        while not stop.is_set():
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                ends = time.monotonic() + length
                while time.monotonic() < ends and not stop.is_set():
                    t0 = time.perf_counter()
                    await conn.fetchval(f"SELECT count(*) FROM {table}")
                    scans.append(time.perf_counter() - t0)
                    started.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), READER_PAUSE)
            length = hold
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def pressure(phase: str, dsn: str, table: str, reader_tx: float,
                   admin: asyncpg.Connection) -> AsyncIterator[dict[str, Any]]:
    """The phase's pressure on the system's database, released on exit; facts about it are
    filled into the yielded dict."""
    info: dict[str, Any] = {}
    if phase == "holder":
        conn = await asyncpg.connect(dsn)
        tx = conn.transaction()
        await tx.start()
        xid = await conn.fetchval("SELECT txid_current()")
        try:
            yield info
        finally:
            now = await admin.fetchval(
                "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
            info["xids_past_holder"] = now - xid
            await tx.rollback()
            await conn.close()
    elif phase == "readers":
        stop = asyncio.Event()
        started = [asyncio.Event() for _ in range(READERS)]
        scans: list[list[float]] = [[] for _ in range(READERS)]
        tasks = [asyncio.create_task(_reader(dsn, table, reader_tx * (i + 1) / READERS,
                                             reader_tx, stop, started[i], scans[i]))
                 for i in range(READERS)]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=30)
            yield info
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            every = [s for reader in scans for s in reader]
            info["reader_scans"] = len(every)
            info["reader_scan_ms_p50"] = 1000 * percentile(every, 50)
    else:
        yield info


async def _sizes(conn: asyncpg.Connection, table: str) -> tuple[int, int]:
    row = await conn.fetchrow(_SIZES, table)
    assert row is not None
    return int(row["jobs"]), int(row["all_tables"])


async def one_system(drain: drains_mod.Drain, size: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The four phases of one system; per phase its numbers."""
    system = drain.system
    n = drains_mod.runs(drain, size["runs"])
    await system.reset()
    await system.conn.execute(f"VACUUM {drain.jobs_table}")
    found: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        async with pressure(phase, system.dsn, drain.jobs_table, size["reader_tx"],
                            system.conn) as info:
            jobs0, all0 = await _sizes(system.conn, drain.jobs_table)
            await system.enqueue(n)
            seconds = await drain.run(n, size["concurrency"])
            probe = drain.latency and (size["probe_all"] or drain.name == "zeroth-worker")
            pickups = await system.latency(size["probe"], size["gap"]) if probe else []
            jobs1, all1 = await _sizes(system.conn, drain.jobs_table)
        found[phase] = {"runs": n, "throughput": n / seconds, "pickups_ms": pickups,
                        "jobs_bytes": (jobs0, jobs1), "all_bytes": (all0, all1), **info}
    return found


async def pressure_scenario(cfg: Config, s: Any) -> ScenarioReport:
    size = sizes(cfg)
    rep = ScenarioReport("pressure", "Production pressure: drain rate and pickup latency clean, "
                         "under an idle-in-transaction XID holder, under four REPEATABLE READ "
                         f"readers, and after (concurrency {size['concurrency']})")
    found, skipped = drains_mod.drains(s)
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {d.name: [] for d in found}
    for round_no in range(size["repeat"]):
        shift = round_no % len(found)
        for drain in [*found[shift:], *found[:shift]]:
            runs[drain.name].append(await one_system(drain, size))
    for name, rounds in runs.items():
        for phase in PHASES:
            params = {"phase": phase}
            per = [r[phase] for r in rounds]
            rep.results.append(Result(rep.name, name, "throughput", "runs/s",
                                      tuple(p["throughput"] for p in per), params,
                                      extra={"rounds": per}))
            if all(p["pickups_ms"] for p in per):
                for q in (50, 99):
                    rep.results.append(Result(
                        rep.name, name, f"pickup_p{q}", "ms",
                        tuple(percentile(p["pickups_ms"], q) for p in per), params,
                        higher_is_better=False))
            for key, metric in (("jobs_bytes", "jobs_growth"), ("all_bytes", "all_growth")):
                rep.results.append(Result(
                    rep.name, name, metric, "kB",
                    tuple((p[key][1] - p[key][0]) / 1024 for p in per), params,
                    higher_is_better=False, extra={"bytes": [p[key] for p in per]}))
    pick = {metric: [r for r in rep.results if r.metric == metric]
            for metric in ("throughput", "pickup_p50", "pickup_p99", "jobs_growth",
                           "all_growth")}
    rep.tables.append("Drain rate (runs/s)\n\n" + report.grid(pick["throughput"],
                                                              column="phase"))
    if pick["pickup_p99"]:
        rep.tables.append("Pickup latency p50 (ms)\n\n"
                          + report.grid(pick["pickup_p50"], column="phase", digits=1))
        rep.tables.append("Pickup latency p99 (ms)\n\n"
                          + report.grid(pick["pickup_p99"], column="phase", digits=1))
    rep.tables.append("Jobs table growth during the phase (kB, table + indexes + TOAST)\n\n"
                      + report.grid(pick["jobs_growth"], column="phase"))
    rep.tables.append("Growth of all the system's tables during the phase (kB; pgqueuer's log, "
                      "procrastinate's events, zeroth's admission slots included)\n\n"
                      + report.grid(pick["all_growth"], column="phase"))
    rep.targets += _targets(rep.results, [d.name for d in found])
    holder = [r["holder"] for rounds in runs.values() for r in rounds]
    readers = [r["readers"] for rounds in runs.values() for r in rounds]
    slow = ", ".join(f"{d.name} {drains_mod.runs(d, size['runs'])}" for d in found
                     if d.runs_share < 1)
    rep.notes.append(
        f"{size['runs']} runs per phase per system{f' ({slow})' if slow else ''}, drained at "
        f"concurrency {size['concurrency']}; then a {size['probe']}-run "
        f"wakeup probe {1000 * size['gap']:.0f} ms apart; {size['repeat']} round(s), the system "
        "order rotated. The holder pinned the horizon across "
        f"{min(h['xids_past_holder'] for h in holder)}–{max(h['xids_past_holder'] for h in holder)}"
        " transactions per system; the readers ran "
        f"{sum(r['reader_scans'] for r in readers)} scans in all ({READERS} readers, "
        f"{size['reader_tx']:.0f} s transactions, {1000 * READER_PAUSE:.0f} ms between scans). "
        "Tables keep their finished rows (pgqueuer moves them to its log table), so growth in "
        "the clean phase is the rows themselves; what the holder adds beyond that is dead "
        "versions nothing may remove. Latency percentiles of a short probe are few samples: p99 "
        "is close to the maximum. seed polls every 0.5 s (upstream's default), so its pickup "
        "is the poll interval whatever the pressure.")
    if skipped:
        rep.notes.append(f"Not measured (no drain adapter in bench/drains.py): "
                         f"{', '.join(skipped)}.")
    return rep


def _get(results: list[Result], system: str, metric: str, phase: str) -> Result | None:
    return next((r for r in results if r.system == system and r.metric == metric
                 and r.params.get("phase") == phase), None)


def _ratio(results: list[Result], system: str, metric: str) -> float | None:
    clean, held = (_get(results, system, metric, p) for p in ("clean", "holder"))
    if clean is None or held is None or not clean.median:
        return None
    return held.median / clean.median


def _targets(results: list[Result], systems: list[str]) -> list[Target]:
    ours = [name for name in systems if name.startswith("zeroth")]
    peers = [name for name in systems if not name.startswith("zeroth")]

    def beside(metric: str) -> str:
        found = [(name, _ratio(results, name, metric)) for name in peers]
        return "; peers: " + ", ".join(f"{name} {r:.2f}×" for name, r in found if r is not None)

    targets = []
    p99 = _ratio(results, "zeroth-worker", "pickup_p99")
    clean, held = (_get(results, "zeroth-worker", "pickup_p99", p) for p in ("clean", "holder"))
    goal = (f"under an idle-in-transaction holder, zeroth-worker pickup p99 within "
            f"{HOLDER_P99_LIMIT:.0f}× of clean")
    if p99 is None or clean is None or held is None:
        targets.append(Target(goal, "not measured", None))
    else:
        targets.append(Target(goal, f"{held.median:.1f} vs {clean.median:.1f} ms clean "
                              f"({p99:.2f}×){beside('pickup_p99')}", p99 <= HOLDER_P99_LIMIT))
    rates = {name: _ratio(results, name, "throughput") for name in ours}
    goal = (f"under an idle-in-transaction holder, no collapse of zeroth throughput "
            f"(≥ {100 * COLLAPSE:.0f}% of clean)")
    if not rates or any(r is None for r in rates.values()):
        targets.append(Target(goal, "not measured", None))
    else:
        targets.append(Target(goal, ", ".join(f"{name} {r:.2f}×" for name, r in rates.items())
                              + " of clean" + beside("throughput"),
                              all(r is not None and r >= COLLAPSE for r in rates.values())))
    return targets
