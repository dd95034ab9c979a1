"""Migration 0004 enforces one active run per thread over data written before it.

Before 0004 a thread_id was only a label, so a database may hold several active runs of one
thread. The migration keeps one per thread (running first, then waiting, then pending; oldest
first), queues the other pending runs in creation order, ends the other running or waiting runs
as failed with stop_reason thread_dedupe, and only then builds the unique index (deer-flow's
test_migration_dedupes_duplicate_active_rows_before_unique_index).
"""

from __future__ import annotations

import json

import psycopg
from schema_catalog import install_released

from zeroth_pg import migrate

ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', thread_id => %s)"
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_pending(deployment_ref => 'd',
               worker_id => 'w', batch_size => 100) WHERE run_id IS NOT NULL"""


def test_migration_dedupes_duplicate_active_rows_before_unique_index(
        empty_database_dsn: str) -> None:
    install_released(empty_database_dsn, "0003")  # as release 0003 left it, functions included
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        def enqueue(thread: str) -> str:
            row = conn.execute(ENQUEUE, (thread,)).fetchone()
            assert row is not None
            return str(row[0])

        pending = [enqueue("queue-me") for _ in range(3)]
        running = [enqueue("busy") for _ in range(2)]
        paused = enqueue("busy")
        single = enqueue("alone")
        for run_id, generation in conn.execute(CLAIM).fetchall():
            if str(run_id) in (*running, paused):
                conn.execute("SELECT zeroth.start_run(run_id => %s, worker_id => 'w', "
                             "generation => %s)", (run_id, generation))
            else:
                conn.execute("SELECT zeroth.release_lease(run_id => %s, worker_id => 'w', "
                             "generation => %s)", (run_id, generation))
        conn.execute("SELECT zeroth.pause_run(run_id => %s, worker_id => 'w', generation => 1, "
                     "reason => 'approval')", (paused,))

    migrate.upgrade(empty_database_dsn)

    with psycopg.connect(empty_database_dsn) as conn:
        rows = {str(r[0]): r[1:] for r in conn.execute(
            """SELECT r.run_id, r.status::text, r.thread_queued_at IS NOT NULL, r.error,
                      r.lease_worker_id FROM zeroth.runs r""")}
        assert rows[pending[0]][:2] == ("pending", False)
        assert [rows[p][:2] for p in pending[1:]] == [("waiting", True)] * 2
        assert rows[running[0]][:2] == ("running", False)
        for ended in (running[1], paused):
            status, queued, error, holder = rows[ended]
            assert (status, queued, holder) == ("failed", False, None)
            assert (error if isinstance(error, dict) else json.loads(error))["stop_reason"] == (
                "thread_dedupe")
        assert rows[single][:2] == ("pending", False)
        index = conn.execute("SELECT pg_get_indexdef('zeroth.runs_thread_active_idx'::regclass)"
                             ).fetchone()
        assert index is not None
        assert "UNIQUE" in index[0]
        # The queue it built is served like any other: the kept run ends, the next one starts.
        conn.execute("SELECT zeroth.request_cancel(run_id => %s)", (pending[0],))
        assert conn.execute("SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = %s",
                            (pending[1],)).fetchone() == ("pending",)
