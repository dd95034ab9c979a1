"""SQL changes proposed by the benchmark, measured on a scratch database — not part of sql/.

Issue 6's peer ratios are out of reach for a lifecycle of three calls per run (claim, start_run,
complete_run): pgqueuer acknowledges in batches and the raw floor finishes a whole batch with two
statements. These prototypes show what two SQL-side changes would buy, measured side by side with
the shipped functions:

* ``plan_cache_mode = force_generic_plan`` on ``zeroth._lease_locked_runs`` (a function
  attribute): its statement is re-planned on every claim because the planner keeps preferring a
  custom plan for the run-id array, and planning costs several times the execution;
* ``claim_and_start`` — claim_pending for a worker that starts what it claims at once (the
  RunWorker always does): lease and pending → running in one statement, one round trip less per
  run;
* ``complete_runs`` — complete_run for many (run_id, generation) pairs in one statement, fenced
  per row in the predicate as complete_run is, so a worker can acknowledge in batches.

The prototypes keep the fence (worker, generation, live lease in the UPDATE's predicate) but leave
out what a shipped version needs (max_concurrency slots, recovery checkpoint, argument checks,
SECURITY DEFINER): the numbers are an upper bound of the gain, not a finished design.
"""

from __future__ import annotations

import asyncio
import time

from bench.harness import pool
from bench.systems import DEPLOYMENT, Zeroth

SCHEMA = """
CREATE SCHEMA bench_proposal;

ALTER FUNCTION zeroth._lease_locked_runs(text, text, uuid[], integer[], text, timestamptz,
                                         interval, integer, integer)
    SET plan_cache_mode = force_generic_plan;

CREATE FUNCTION bench_proposal.claim_and_start(
    deployment_ref text, worker_id text, batch_size integer, lease_seconds double precision)
    RETURNS TABLE (run_id uuid, lease_generation bigint)
    LANGUAGE sql VOLATILE
BEGIN ATOMIC
    WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
    locked AS MATERIALIZED (
        SELECT r.run_id
          FROM zeroth.runs r, now n
         WHERE r.tenant_id = 'default' AND r.workspace_key = ''
           AND r.deployment_ref = claim_and_start.deployment_ref
           AND r.status = 'pending' AND r.run_after <= n.t
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < n.t)
         ORDER BY r.priority DESC, r.run_after, r.created_at
         LIMIT claim_and_start.batch_size
           FOR UPDATE OF r SKIP LOCKED)
    UPDATE zeroth.runs r
       SET status = 'running', attempts = r.attempts + 1, started_at = n.t, updated_at = n.t,
           lease_worker_id = claim_and_start.worker_id, lease_acquired_at = n.t,
           lease_expires_at = n.t + make_interval(secs => claim_and_start.lease_seconds),
           lease_generation = r.lease_generation + 1
      FROM locked l, now n
     WHERE r.tenant_id = 'default' AND r.workspace_key = '' AND r.run_id = l.run_id
    RETURNING r.run_id, r.lease_generation;
END;

CREATE FUNCTION bench_proposal.complete_runs(worker_id text, run_ids uuid[], generations bigint[])
    RETURNS integer
    LANGUAGE sql VOLATILE
BEGIN ATOMIC
    WITH done AS (
        UPDATE zeroth.runs r
           SET status = 'completed', finished_at = clock_timestamp(),
               updated_at = clock_timestamp(), lease_worker_id = NULL, lease_acquired_at = NULL,
               lease_expires_at = NULL, admission_slot = NULL, recovery_checkpoint_id = NULL
          FROM unnest(complete_runs.run_ids, complete_runs.generations) AS q(run_id, generation)
         WHERE r.tenant_id = 'default' AND r.workspace_key = '' AND r.run_id = q.run_id
           AND r.lease_worker_id = complete_runs.worker_id AND r.lease_generation = q.generation
           AND r.lease_expires_at >= clock_timestamp() AND r.status = 'running'
        RETURNING 1)
    SELECT count(*)::integer FROM done;
END;
"""

CLAIM_AND_START = """SELECT run_id, lease_generation FROM bench_proposal.claim_and_start(
    deployment_ref => $1, worker_id => $2, batch_size => $3, lease_seconds => 60)"""

COMPLETE_RUNS = """SELECT bench_proposal.complete_runs(worker_id => $1, run_ids => $2::uuid[],
    generations => $3::bigint[])"""


class Proposal(Zeroth):
    """zeroth_pg with the proposed functions, on its own migrated database."""

    label = "proposal"

    async def setup(self) -> None:
        await super().setup()
        await self.conn.execute(SCHEMA)

    async def drain_batched(self, n: int, *, concurrency: int, batch: int) -> float:
        """``concurrency`` loops of claim_and_start(batch) → complete_runs(batch): two
        statements per batch, every write fenced."""
        async with pool(self.dsn, concurrency) as loops:

            async def loop(worker_id: str) -> int:
                done = 0
                async with loops.acquire() as conn:
                    while rows := await conn.fetch(CLAIM_AND_START, DEPLOYMENT, worker_id, batch):
                        completed = await conn.fetchval(
                            COMPLETE_RUNS, worker_id, [r["run_id"] for r in rows],
                            [r["lease_generation"] for r in rows])
                        assert completed == len(rows)
                        done += completed
                return done

            started = time.perf_counter()
            done = await asyncio.gather(*(loop(f"proposal-{i}") for i in range(concurrency)))
            elapsed = time.perf_counter() - started
        assert sum(done) == n, f"proposal finished {sum(done)} of {n}"
        return elapsed
