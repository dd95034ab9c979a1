"""Timeouts under attack: a claim that meets a pending run past its run
deadline, and calls of internal helpers that no longer exist (a merge of two branches: one dropped
zeroth._free_slot, the other called it)."""

from __future__ import annotations

import glob
import re
from pathlib import Path

from helpers import at, enqueue, run_row
from test_timeouts import claim_start, set_timeouts, sweep

SQL = Path(__file__).resolve().parents[2] / "sql" / "functions"


class TestAClaimMeetingALateRunGoesOn:
    async def test_a_pending_run_past_its_deadline_neither_blocks_nor_fails_the_claim(self, conn):
        await set_timeouts(conn, 10, 100)
        late = await enqueue(conn)
        await claim_start(conn, 0)
        await sweep(conn, 11)  # attempt timed out: pending again, its run deadline 100
        fresh = await enqueue(conn)

        claimed = await claim_start(conn, 101)

        assert [r["run_id"] for r in claimed] == [fresh]
        assert (await run_row(conn, late))["status"] == "failed"


def test_every_internal_helper_a_function_calls_is_defined():
    # PL/pgSQL resolves calls when they run: a call of a dropped helper passes every install
    # and upgrade check and raises 42883 only on the path that reaches it.
    files = {f: Path(f).read_text() for f in glob.glob(str(SQL / "**" / "*.sql"), recursive=True)}
    defined = set()
    for text in files.values():
        defined |= set(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION zeroth\.(\w+)", text))
    missing = set()
    for name, text in files.items():
        code = "\n".join(line for line in text.splitlines()
                         if not line.lstrip().startswith(("--", "DROP FUNCTION")))
        missing |= {(name, m) for m in re.findall(r"zeroth\.(_\w+)\s*\(", code)
                    if m not in defined}
    assert missing == set()


class TestAdmitAndOwnObeysTheTimeouts:
    async def test_an_owned_admission_is_capped_at_the_deployments_deadlines(self, conn):
        from thread_calls import OWNER, admit, fenced

        await set_timeouts(conn, 10, 100)
        admitted = await admit(conn, worker_id=OWNER, lease_seconds=30)
        run_id = admitted["run_id"]
        assert await fenced(conn, "start_run", run_id, OWNER, 1, now=at(1))

        row = await run_row(conn, run_id)
        # a lease is a claim: the attempt deadline (10 s) and the run deadline (100 s) are fixed
        assert (row["attempt_deadline_at"], row["run_deadline_at"]) == (at(10), at(100))
        assert row["lease_expires_at"] <= at(10)


POISON_PENDING_END = """
CREATE FUNCTION pg_temp.poison_pending_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.payload ? 'poison' AND OLD.status = 'pending' AND NEW.status = 'failed' THEN
        RAISE EXCEPTION 'poisoned end of run %', OLD.run_id USING ERRCODE = 'XX001';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER zz_test_poison_pending_end BEFORE UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION pg_temp.poison_pending_end();
"""


class TestOneBadLatePendingRunNeverStopsTheClaims:
    async def test_a_late_pending_run_whose_end_raises_never_fails_the_claim(self, conn):
        await set_timeouts(conn, 10, 100)
        bad = await enqueue(conn, payload={"poison": 1})
        await claim_start(conn, 0)
        await sweep(conn, 11)  # pending again, run deadline 100
        fresh = await enqueue(conn)
        await conn.execute(POISON_PENDING_END)

        claimed = await claim_start(conn, 101)

        assert [r["run_id"] for r in claimed] == [fresh]
        assert (await run_row(conn, bad))["status"] == "pending"  # left as it was, with a WARNING
