"""Claim-index blocks per claim as claimed (dead, killed) entries pile up at the head of the scope.

One connection: enqueue TOTAL runs, then complete_and_claim batches of 32 (completing the previous
batch) until LEFT runs are still pending; autovacuum off on zeroth.runs (dead entries stay). Per
CHUNK of claims: blocks of runs_claim_pending_idx and of zeroth.runs fetched per claim (the
transaction's own counters). Then a NEW session's first claims (its full scan from the head)."""
import asyncio, sys, time, json
from pathlib import Path
import asyncpg
sys.path.insert(0, '.')
from bench import harness

# python claim_blocks.py 18|15 [BASE_DIR]: with BASE_DIR, the three function files of c6e3dac
# (claim_floor, claims, scopes) re-applied over the migrated database (the code before the change)
BASE = Path(sys.argv[2]) if len(sys.argv) > 2 else None

TOTAL, LEFT, BATCH = 60000, 4000, 32
Q = """SELECT (c.claimed).run_id, (c.claimed).lease_generation FROM zeroth.complete_and_claim(
         deployment_ref => 'bench', worker_id => $1, run_ids => $2::uuid[], generations => $3::bigint[],
         batch_size => 32) c"""
BLK = """SELECT pg_stat_get_xact_blocks_fetched('zeroth.runs_claim_pending_idx'::regclass),
                pg_stat_get_xact_blocks_fetched('zeroth.runs'::regclass),
                pg_stat_get_xact_tuples_returned('zeroth.runs_claim_pending_idx'::regclass)"""

async def claim(conn, worker, ids, gens):
    # pending (unflushed) counters: read before and after, in one transaction (no flush between)
    async with conn.transaction():
        a = await conn.fetchrow(BLK)
        rows = await conn.fetch(Q, worker, ids, gens)
        b = await conn.fetchrow(BLK)
    rows = [r for r in rows if r[0] is not None]
    return [r[0] for r in rows], [r[1] for r in rows], tuple(y - x for x, y in zip(a, b))

async def main(version):
    cm = harness.debian_server() if version == '15' else harness.server('durable')
    with cm as server:
        dsn = await asyncio.to_thread(server.zeroth_database, 'claimblocks')
        conn = await asyncpg.connect(dsn)
        print(await conn.fetchval('select version()'), 'functions:', BASE or 'this branch')
        if BASE is not None:
            async with conn.transaction():
                await conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
                for name in ("claim_floor", "claims", "scopes"):
                    await conn.execute((BASE / f"{name}.sql").read_text())
        await conn.execute("ALTER TABLE zeroth.runs SET (autovacuum_enabled = false)")
        for i in range(0, TOTAL, 500):
            await conn.execute("SELECT count(*) FROM zeroth.enqueue_runs('bench', $1::jsonb)",
                               json.dumps([{"payload": {"n": n}} for n in range(i, i + 500)]))
        ids, gens = [], []
        done, n, acc = 0, 0, [0, 0, 0]
        while done < TOTAL - LEFT:
            ids, gens, b = await claim(conn, 'w1', ids, gens)
            done += len(ids); n += 1
            for k in range(3): acc[k] += b[k]
            if n % 200 == 0:
                print(f"{done:6d} claimed: per claim idx blocks {acc[0]/200:7.1f} heap blocks {acc[1]/200:7.1f} idx entries {acc[2]/200:7.1f}", flush=True)
                acc = [0, 0, 0]
        for label in ('new session', 'new session again'):
            other = await asyncpg.connect(dsn)
            res = []
            i2, g2 = [], []
            for _ in range(5):
                i2, g2, b = await claim(other, 'w2', i2, g2)
                res.append(b)
            print(label, 'first 5 claims (idx blocks, heap blocks, idx entries):', res, flush=True)
            await other.close()
        await conn.close()

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else '18'))
