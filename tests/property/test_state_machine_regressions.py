"""Discrepancies the model-based test found between the SQL and its documented semantics, kept
as plain tests of the correct behaviour after the fix.
"""

from __future__ import annotations

import pytest
from helpers import WORKER, at, claim, enqueue, make_run

TENANT = "t-admission"


@pytest.mark.parametrize("function", ["hand_back_to_pending", "expire_recovery_lease"])
async def test_a_refused_give_back_leaves_the_live_slot_alone(conn, function):
    held = await make_run(conn, "claimed", tenant_id=TENANT, max_concurrency=1)  # pending, slot 1
    await enqueue(conn, tenant_id=TENANT)
    refused = await conn.fetchval(
        f"""SELECT zeroth_test.{function}(run_id => $1, worker_id => $2, generation => $3,
                tenant_id => $4, now_override => $5)""",
        held.run_id, WORKER, held.generation, TENANT, at(1))
    assert refused is False  # documented: "Returns false on no match" (the run is not running)
    # The holder's lease is live and holds the only slot: nobody else is admitted ...
    assert await claim(conn, worker_id="worker-b", tenant_id=TENANT, max_concurrency=1,
                       now=at(2)) == []
    # ... and its renewal still works.
    assert await conn.fetchval(
        """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               tenant_id => $4, now_override => $5)""",
        held.run_id, WORKER, held.generation, TENANT, at(3)) is True
