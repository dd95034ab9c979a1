"""The factories in tests/helpers.py reach every status through the API."""

from __future__ import annotations

import pytest
from helpers import make_run, run_row


@pytest.mark.parametrize(
    "status", ["pending", "claimed", "running", "waiting", "completed", "failed", "cancelled"])
async def test_make_run_reaches_status(conn, status):
    lease = await make_run(conn, status)
    row = await run_row(conn, lease.run_id)
    expected = "pending" if status == "claimed" else status
    assert row["status"] == expected
    assert (row["lease_worker_id"] is not None) == (status in ("claimed", "running"))
