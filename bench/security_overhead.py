"""What SECURITY DEFINER + a pinned search_path costs on the hot path (0006_security).

    python bench/security_overhead.py [--runs 2000] [--repeat 3]

Times claim_pending → start_run → complete_run cycles (three calls each, one connection), sent
as round trips and looped in one DO block, and a DO block of as many current_generation calls,
with the functions as shipped (SECURITY DEFINER, ``SET search_path``) and with both attributes
removed (SECURITY INVOKER, the caller's search_path). ``runs`` cycles per mode and
repeat, in blocks of ``--block`` cycles that alternate the modes (so load from elsewhere on the
machine hits both alike); the median block is reported. Uses ZEROTH_PG_DSN (an admin DSN; a
scratch database is created and dropped) or a throwaway server. Informational: asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator

import asyncpg

from zeroth_pg import migrate
from zeroth_pg.testing import create_database, drop_database, start_server

HOT_PATH = ("claim_pending", "start_run", "complete_run", "current_generation")
MODES = {
    "definer": "SECURITY DEFINER SET search_path = pg_catalog, pg_temp",
    "invoker": "SECURITY INVOKER RESET search_path",
}


async def enqueue(conn: asyncpg.Connection, runs: int) -> str:
    deployment = f"bench-{uuid.uuid4().hex[:8]}"
    await conn.execute(
        "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::jsonb)",
        deployment, "[" + ",".join(["{}"] * runs) + "]")
    return deployment


async def round_trips(conn: asyncpg.Connection, runs: int) -> float:
    """Seconds for ``runs`` cycles sent from the client, one statement per call."""
    deployment = await enqueue(conn, runs)
    started = time.perf_counter()
    for _ in range(runs):
        row = await conn.fetchrow(
            """SELECT run_id, lease_generation FROM zeroth.claim_pending(deployment_ref => $1,
                   worker_id => 'bench', batch_size => 1, lease_seconds => 60)""", deployment)
        assert row is not None
        assert row["run_id"] is not None
        fence = (row["run_id"], row["lease_generation"])
        assert await conn.fetchval(
            """SELECT zeroth.start_run(run_id => $1, worker_id => 'bench',
                   generation => $2)""", *fence)
        assert await conn.fetchval(
            """SELECT zeroth.complete_run(run_id => $1, worker_id => 'bench', generation => $2,
                   output => '{}')""", *fence)
    return time.perf_counter() - started


async def in_server(conn: asyncpg.Connection, runs: int) -> float:
    """Seconds for ``runs`` cycles looped inside one DO block: the server-side cost alone."""
    deployment = await enqueue(conn, runs)
    started = time.perf_counter()
    await conn.execute(f"""DO $bench$
        DECLARE
            v_run zeroth.claimed_run;
        BEGIN
            FOR i IN 1..{runs} LOOP
                SELECT * INTO v_run FROM zeroth.claim_pending(deployment_ref => '{deployment}',
                    worker_id => 'bench', batch_size => 1, lease_seconds => 60);
                PERFORM zeroth.start_run(run_id => v_run.run_id, worker_id => 'bench',
                    generation => v_run.lease_generation);
                PERFORM zeroth.complete_run(run_id => v_run.run_id, worker_id => 'bench',
                    generation => v_run.lease_generation, output => '{{}}');
            END LOOP;
        END
        $bench$""")
    return time.perf_counter() - started


async def cheap_calls(conn: asyncpg.Connection, runs: int) -> float:
    """Seconds for 3 x ``runs`` current_generation calls in one DO block: the fixed cost of a
    call (the user switch and search_path save/restore) next to a one-row read."""
    run_id = await conn.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'c')")
    started = time.perf_counter()
    await conn.execute(f"""DO $bench$ BEGIN
            FOR i IN 1..{3 * runs} LOOP
                PERFORM zeroth.current_generation(run_id => '{run_id}');
            END LOOP;
        END $bench$""")
    return time.perf_counter() - started


KINDS = {"round trips": round_trips, "in server": in_server, "read only": cheap_calls}


async def measure(dsn: str, runs: int, repeat: int,
                  block: int) -> dict[tuple[str, str], list[float]]:
    """Seconds per block of ``block`` cycles, per (kind, mode)."""
    conn = await asyncpg.connect(dsn)
    seconds: dict[tuple[str, str], list[float]] = {}
    try:
        for kind in KINDS.values():  # warm caches and plans
            await kind(conn, block)
        order = list(MODES)
        for _ in range(repeat * runs // block):
            for mode in order:
                for name in HOT_PATH:
                    await conn.execute(f"ALTER FUNCTION zeroth.{name} {MODES[mode]}")
                for kind_name, kind in KINDS.items():
                    seconds.setdefault((kind_name, mode), []).append(await kind(conn, block))
            order.reverse()
        for name in HOT_PATH:  # leave the database as migrated
            await conn.execute(f"ALTER FUNCTION zeroth.{name} {MODES['definer']}")
    finally:
        await conn.close()
    return seconds


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    with contextlib.ExitStack() as stack:
        admin = os.environ.get("ZEROTH_PG_DSN") or stack.enter_context(start_server()).dsn
        name = f"zeroth_bench_{uuid.uuid4().hex[:8]}"
        dsn = create_database(admin, name)
        stack.callback(drop_database, admin, name)
        migrate.upgrade(dsn)
        yield dsn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block", type=int, default=200)
    args = parser.parse_args()
    with scratch_database() as dsn:
        seconds = asyncio.run(measure(dsn, args.runs, args.repeat, args.block))
    calls = 3 * args.block
    per_call = {key: 1e6 * statistics.median(values) / calls for key, values in seconds.items()}
    for kind in KINDS:
        for mode in MODES:
            print(f"{kind:11} {mode:8} {len(seconds[kind, mode])} blocks of {args.block} "
                  f"cycles: median {per_call[kind, mode]:.1f} µs per call")
        extra = per_call[kind, "definer"] - per_call[kind, "invoker"]
        print(f"{kind:11} SECURITY DEFINER + SET search_path: {extra:+.1f} µs per call "
              f"({100 * extra / per_call[kind, 'invoker']:+.1f}%)")

if __name__ == "__main__":
    main()
