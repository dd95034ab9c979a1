"""count_pending's query on PG 18 after statistics taken while every run was pending: 2,000 pending,
then N x 1,000 runs enqueued, claimed and completed; EXPLAIN (ANALYZE, BUFFERS) as it is, with
enable_seqscan off, and with enable_bitmapscan off too (two calls each)."""
import asyncio, sys, json
sys.path.insert(0, '.')  # run from the repository root: python bench/results/2026-12-06-decay/count_explain.py 20
import asyncpg
from bench import harness

Q = """SELECT count(*) FROM zeroth.runs r WHERE r.tenant_id = 'default' AND r.workspace_key = ''
       AND r.deployment_ref = 'd' AND r.status = 'pending'"""

async def main():
    with harness.server('durable') as server:
        dsn = await asyncio.to_thread(server.zeroth_database, 'cexp')
        c = await asyncpg.connect(dsn)
        await c.execute("ALTER TABLE zeroth.runs SET (autovacuum_enabled = false)")
        await c.execute("SELECT count(*) FROM zeroth.enqueue_runs('d', $1::jsonb)", json.dumps([{}]*2000))
        await c.execute("ANALYZE zeroth.runs")
        for b in range(int(sys.argv[1])):
            await c.execute("SELECT count(*) FROM zeroth.enqueue_runs('d', $1::jsonb)", json.dumps([{"priority": 1}]*1000))
            rows = await c.fetch("SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd', worker_id => 'w', batch_size => 1000, lease_seconds => 600)")
            await c.fetch("SELECT * FROM zeroth.complete_runs(worker_id => 'w', run_ids => $1, generations => $2)", [r[0] for r in rows], [r[1] for r in rows])
        print('heap pages', await c.fetchval("select pg_relation_size('zeroth.runs')/8192"))
        for settings in ([], ["SET enable_seqscan = off"], ["SET enable_seqscan = off", "SET enable_bitmapscan = off"]):
            for s in settings: await c.execute(s)
            for i in range(2):
                plan = await c.fetch("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + Q)
                print(settings, i, ' | '.join(r[0].strip() for r in plan if 'Planning' not in r[0]))
            await c.execute("RESET ALL")
        await c.close()

asyncio.run(main())
