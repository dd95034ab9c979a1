"""Fenced writes racing a takeover: a stale holder keeps writing while a new holder claims.

200 fresh runs. For each, the old holder's lease is cut short (30-300 ms to begin with, then
following the outcomes: see SHORT_LEASE) while it streams commit_fenced writes and finally
complete_run; on a second session a new holder polls
claim_orphaned and, once it owns the run, writes and completes it. Half the old holders are
"slow": their calls carry a clock sample taken before their lease expired (now_override), the
interleaving where the expiry predicate passes and only the generation in the fence can refuse
the write.

An audit trigger (test instrumentation on this throwaway database only) records every row
version the functions write, so the test can check each accepted write against the generation
the row had when the write landed, not just the final state.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import timedelta
from typing import Any

import asyncpg

RUNS = 200
PARALLEL = 10
#: The old holder's lease is cut to scale * 10**u, u uniform in [0, 1) (a seeded draw per run),
#: the scale starting at SHORT_LEASE: 30-300 ms. Both orders must happen (the old holder done in
#: time, the new one taking over). Where the old holder finishes moves with the machine's load:
#: with every lease at 30 ms a loaded machine (load average 15-30) slowed every old holder past
#: its lease and all 200 runs were taken over; spread over 30-300 ms, a starved run (six CPU hogs
#: beside it, nice 10) still had 197 and 198 of 200 taken over. So the scale follows the
#: outcomes, as the takeover race in test_batch_lease_races does: doubled after a wave of
#: PARALLEL races the new holders all won, halved after one the old holders all won. The leases
#: settle where both orders happen, and every race is run near that edge, at any speed.
SHORT_LEASE = 0.03

AUDIT = """
CREATE TABLE public.fence_audit (
    seq            bigserial PRIMARY KEY,
    run_id         uuid,
    old_generation bigint,
    new_generation bigint,
    old_output     jsonb,
    new_output     jsonb,
    old_progress   jsonb,
    new_progress   jsonb,
    new_status     text);
-- The trigger fires as the writer: zeroth_owner, since the functions are SECURITY DEFINER (0006).
GRANT INSERT ON public.fence_audit TO zeroth_owner;
GRANT USAGE ON SEQUENCE public.fence_audit_seq_seq TO zeroth_owner;
CREATE FUNCTION public.fence_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.fence_audit (run_id, old_generation, new_generation, old_output, new_output,
                                    old_progress, new_progress, new_status)
    VALUES (NEW.run_id, OLD.lease_generation, NEW.lease_generation, OLD.output, NEW.output,
            OLD.progress, NEW.progress, NEW.status::text);
    RETURN NULL;
END $$;
CREATE TRIGGER fence_audit AFTER UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION public.fence_audit_row();
"""

COMMIT = """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                columns => $4::text::jsonb, now_override => $5)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => $4::text::jsonb, now_override => $5)"""


async def prepare(setup: asyncpg.Connection, index: int) -> tuple[Any, str, int]:
    """A running run in its own deployment, held by old-<index> (long lease for now)."""
    deployment = f"fence-{index}"
    run_id = await setup.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)", deployment)
    generation = await setup.fetchval(
        """SELECT c.lease_generation FROM zeroth.claim_pending(deployment_ref => $1,
               worker_id => $2, lease_seconds => 300) c""", deployment, f"old-{index}")
    assert await setup.fetchval(
        "SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3)",
        run_id, f"old-{index}", generation)
    return run_id, deployment, generation


async def race(index: int, run: tuple[Any, str, int], old: asyncpg.Connection,
               new: asyncpg.Connection, rng: random.Random, scale: float) -> dict[str, Any]:
    run_id, deployment, generation = run
    old_worker, new_worker = f"old-{index}", f"new-{index}"
    slow = index % 2 == 1
    lease = scale * 10 ** rng.random()
    outcome: dict[str, Any] = {"run_id": run_id, "generation": generation, "lease": lease,
                               "old_writes": [], "old_complete": None, "new_claim": None,
                               "new_writes": []}

    async def old_holder() -> None:
        # Cut the lease short: from here on the takeover can happen any time.
        async with old.transaction():
            assert await old.fetchval(
                """SELECT zeroth.renew_lease(run_id => $1, worker_id => $2, generation => $3,
                       lease_seconds => $4)""", run_id, old_worker, generation, lease)
            expires = await old.fetchval(
                "SELECT r.lease_expires_at FROM zeroth.runs r WHERE r.run_id = $1", run_id)
        # A slow holder's calls all carry a clock sample from just before its expiry.
        clock = expires - timedelta(milliseconds=1) if slow else None
        seq = 0
        while True:
            await asyncio.sleep(rng.uniform(0, 0.008))
            columns = json.dumps({"progress": {"gen": generation, "seq": seq}})
            ok = await old.fetchval(COMMIT, run_id, old_worker, generation, columns, clock)
            outcome["old_writes"].append(ok)
            if not ok or rng.random() < 0.1:
                break
            seq += 1
        output = json.dumps({"gen": generation, "by": "old"})
        outcome["old_complete"] = await old.fetchval(
            COMPLETE, run_id, old_worker, generation, output, clock)
        # A fenced-out holder stays fenced out.
        if not outcome["old_complete"]:
            columns = json.dumps({"progress": {"gen": generation, "seq": -1}})
            outcome["old_writes"].append(
                await old.fetchval(COMMIT, run_id, old_worker, generation, columns, clock))

    async def new_holder() -> None:
        while True:
            rows = [row for row in await new.fetch(
                """SELECT c.run_id, c.lease_generation FROM zeroth.claim_orphaned(
                       deployment_ref => $1, worker_id => $2, claim_limit => 1,
                       lease_seconds => 300) c""", deployment, new_worker)
                    if row["run_id"] is not None]
            if rows:
                break
            status = await new.fetchval(
                "SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1", run_id)
            if status != "running":
                return  # the old holder finished in time: nothing to take over
            await asyncio.sleep(0.001)
        (row,) = rows
        assert row["run_id"] == run_id
        new_generation = row["lease_generation"]
        outcome["new_claim"] = new_generation
        columns = json.dumps({"progress": {"gen": new_generation, "seq": 0}})
        outcome["new_writes"].append(
            await new.fetchval(COMMIT, run_id, new_worker, new_generation, columns, None))
        output = json.dumps({"gen": new_generation, "by": "new"})
        outcome["new_writes"].append(
            await new.fetchval(COMPLETE, run_id, new_worker, new_generation, output, None))

    await asyncio.gather(old_holder(), new_holder())
    return outcome


async def test_exactly_one_holder_lands_when_writes_race_a_takeover(connect: Any) -> None:
    setup = await connect()
    await setup.execute(AUDIT)
    runs = [await prepare(setup, index) for index in range(RUNS)]
    olds = [await connect() for _ in range(PARALLEL)]
    news = [await connect() for _ in range(PARALLEL)]
    rng = random.Random(20300101)

    outcomes: list[dict[str, Any]] = []
    scale = SHORT_LEASE
    for start in range(0, RUNS, PARALLEL):
        wave = await asyncio.wait_for(asyncio.gather(*(
            race(start + i, runs[start + i], olds[i], news[i], rng, scale)
            for i in range(PARALLEL))), timeout=60)
        outcomes += wave
        taken = sum(o["new_claim"] is not None for o in wave)
        if taken == PARALLEL:
            scale *= 2  # every old holder overran its lease: give the next ones longer
        elif taken == 0:
            scale /= 2  # every old holder finished in time: cut the next ones shorter

    final = {row["run_id"]: row for row in await setup.fetch(
        "SELECT r.run_id, r.status::text, r.lease_generation, r.output, r.progress "
        "FROM zeroth.runs r")}
    takeovers = 0
    for outcome in outcomes:
        row = final[outcome["run_id"]]
        generation = outcome["generation"]
        took_over = outcome["new_claim"] is not None
        takeovers += took_over
        # Exactly one complete_run landed.
        assert outcome["old_complete"] is not took_over, outcome
        if took_over:
            assert outcome["new_claim"] == generation + 1
            assert outcome["new_writes"] == [True, True], outcome
        # Once refused, the old holder never got another write in.
        writes = outcome["old_writes"]
        assert writes == sorted(writes, reverse=True), outcome
        # The row ends completed by the current generation's holder, with its output.
        assert row["status"] == "completed"
        assert row["lease_generation"] == (generation + 1 if took_over else generation)
        assert json.loads(row["output"]) == {
            "gen": row["lease_generation"], "by": "new" if took_over else "old"}
        if took_over:
            assert json.loads(row["progress"]) == {"gen": generation + 1, "seq": 0}

    # Every accepted write carried the generation the row had when it landed: no stale write
    # slipped in after a takeover, not even one overwritten later.
    stale = await setup.fetch(
        """SELECT a.* FROM public.fence_audit a
            WHERE (a.new_progress IS DISTINCT FROM a.old_progress
                   AND ((a.new_progress ->> 'gen')::bigint <> a.new_generation
                        OR a.new_generation <> a.old_generation))
               OR (a.new_output IS DISTINCT FROM a.old_output
                   AND ((a.new_output ->> 'gen')::bigint <> a.new_generation
                        OR a.new_generation <> a.old_generation))""")
    assert stale == []
    # Each run's generation moved at most once during the race, and only by the takeover.
    bumps = await setup.fetch(
        """SELECT a.run_id, count(*) AS n FROM public.fence_audit a
            WHERE a.new_generation <> a.old_generation AND a.old_generation > 0
            GROUP BY a.run_id HAVING count(*) > 1""")
    assert bumps == []
    assert await setup.fetchval(
        "SELECT count(*) FROM public.fence_audit a WHERE a.new_generation <> a.old_generation "
        "AND a.old_generation > 0") == takeovers
    # Both orders happened, so both sides of the race were exercised.
    print(f"takeovers: {takeovers} of {RUNS}; at leases under 100 ms: "
          f"{sum(o['new_claim'] is not None for o in outcomes if o['lease'] < 0.1)} of "
          f"{sum(o['lease'] < 0.1 for o in outcomes)}; last scale {scale * 1000:.0f} ms")
    assert 0 < takeovers < RUNS
