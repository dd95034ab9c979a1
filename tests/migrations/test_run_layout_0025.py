"""Migration 0025 moves lease_worker_id, lease_acquired_at and started_at of zeroth.runs right
behind completed_worker_id, completed_claimed_at (only NULL-in-both columns between), and the
columns no claim nor completion writes behind them again, so that a completion — which moves the
holder and its claim time from the first pair to the second and clears the lease — shares its
row's end with the claimed version and leaves those bytes out of its WAL record (issue 30;
tests/plans/test_hot_path_indexes.py measures the records). A database upgraded from 0024 WITH
runs — pending, leased, running, completed by its first holder, failed — keeps every value of
every run, the moved columns' types, defaults, NOT NULL, comments, every CHECK constraint and
index (the same definitions and comments), and the views that read them (dropped and made again)
answer as before; the constraints still refuse what they refused. The row keeps a 32-byte tuple
header (at most 72 attributes, the dropped ones counted).
"""

from __future__ import annotations

import json

import psycopg
import pytest

from zeroth_pg import migrate

MOVED = ["lease_worker_id", "lease_acquired_at", "started_at", "max_attempts", "checkpoint_seq",
         "hand_backs", "resumable", "metadata", "payload", "created_at", "run_after", "priority",
         "idempotency_key"]
ALL = """SELECT to_jsonb(r) FROM zeroth.runs r ORDER BY run_id"""
SHAPE = """SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid), col_description(a.attrelid, a.attnum)
             FROM pg_attribute a
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = 'zeroth.runs'::regclass AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attname"""
CHECKS = """SELECT conname, pg_get_constraintdef(oid), obj_description(oid, 'pg_constraint')
              FROM pg_constraint
             WHERE conrelid = 'zeroth.runs'::regclass AND contype IN ('c', 'p', 'u', 'f')
             ORDER BY 1"""
INDEXES = """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid),
                    obj_description(indexrelid, 'pg_class')
               FROM pg_index WHERE indrelid = 'zeroth.runs'::regclass ORDER BY 1"""
ORDER = """SELECT attname::text FROM pg_attribute
            WHERE attrelid = 'zeroth.runs'::regclass AND attnum > 0 AND NOT attisdropped
            ORDER BY attnum"""
VIEWS = ["run_list", "run_attempts", "live_leases", "attempt_history"]


def _view(conn: psycopg.Connection, name: str) -> list[tuple[object, ...]]:
    return conn.execute(f"SELECT to_jsonb(v)::text FROM zeroth.{name} v ORDER BY 1").fetchall()


def test_an_upgrade_from_0024_with_runs_moves_the_lease_columns_and_keeps_every_value(
        empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, "0024")
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        # Runs of every shape, written directly (the function files of 0024 are applied only
        # when an upgrade reaches head): leased and running with a holder, completed by its
        # first holder (completed_worker_id), failed, with keys, payloads and progress.
        for i, (status, leased, completed) in enumerate((
                ("pending", False, False), ("pending", True, False), ("running", True, False),
                ("completed", False, True), ("failed", False, False), ("waiting", False, False))):
            conn.execute(
                """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, attempts,
                       run_after, created_at, updated_at, started_at, finished_at,
                       lease_worker_id, lease_acquired_at, lease_expires_at, lease_generation,
                       completed_worker_id, completed_claimed_at, max_attempts, checkpoint_seq,
                       hand_backs, resumable, progress, accounting, metadata, payload, priority,
                       idempotency_key)
                   VALUES (gen_random_uuid(), 't', 'd', %(status)s::zeroth.run_status, %(i)s,
                           now() + %(i)s * interval '1 minute', now() - %(i)s * interval '1 hour',
                           now(), CASE WHEN %(started)s THEN now() - interval '5 minutes' END,
                           CASE WHEN %(status)s::text IN ('completed', 'failed') THEN now() END,
                           CASE WHEN %(leased)s THEN 'worker-' || %(i)s END,
                           CASE WHEN %(leased)s THEN now() - interval '1 minute' END,
                           CASE WHEN %(leased)s THEN now() + interval '1 minute' END,
                           %(i)s, CASE WHEN %(completed)s THEN 'first-holder' END,
                           CASE WHEN %(completed)s THEN now() - interval '2 minutes' END,
                           3 + %(i)s, 7 * %(i)s, %(i)s, %(i)s %% 2 = 0, %(progress)s,
                           %(accounting)s, %(metadata)s, %(payload)s, %(i)s - 1, %(key)s)""",
                {"status": status, "i": i, "leased": leased, "completed": completed,
                 "started": status in ("running", "completed", "failed"),
                 "progress": json.dumps({"step": i}) if i % 2 else None,
                 "accounting": json.dumps({"tokens": 10 * i}),
                 "metadata": json.dumps({"m": "x" * (100 * i)}),
                 "payload": json.dumps({"p": i, "big": "y" * 3000}),
                 "key": f"key-{i}" if i % 2 else None})
        values = conn.execute(ALL).fetchall()
        shape = conn.execute(SHAPE).fetchall()
        checks = conn.execute(CHECKS).fetchall()
        indexes = conn.execute(INDEXES).fetchall()
    assert len(values) == 6

    migrate.upgrade(empty_database_dsn)
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        assert conn.execute(ALL).fetchall() == values
        assert conn.execute(SHAPE).fetchall() == shape
        assert conn.execute(CHECKS).fetchall() == checks
        assert conn.execute(INDEXES).fetchall() == indexes
        order = [r[0] for r in conn.execute(ORDER).fetchall()]
        # The lease pair right behind the completed pair (only columns NULL for a claimed and a
        # completed run of the hot path between), then started_at, then what neither writes.
        between = order[order.index("completed_claimed_at") + 1:order.index("lease_worker_id")]
        assert between == ["progress", "accounting"], order
        assert order[-len(MOVED):] == MOVED, order
        attributes = conn.execute(
            """SELECT count(*) FROM pg_attribute
                WHERE attrelid = 'zeroth.runs'::regclass AND attnum > 0""").fetchone()
        assert attributes is not None
        assert attributes[0] <= 72, attributes
        for name in VIEWS:
            assert _view(conn, name), name  # made again by the function files, and readable
        # The lease's CHECKs still hold on the moved columns.
        pending = conn.execute(
            "SELECT run_id FROM zeroth.runs WHERE status = 'pending' AND lease_worker_id IS NULL"
        ).fetchone()
        assert pending is not None
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE zeroth.runs SET lease_worker_id = 'w' WHERE run_id = %s",
                         pending)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE zeroth.runs SET max_attempts = 0 WHERE run_id = %s", pending)
        with pytest.raises(psycopg.errors.NotNullViolation):
            conn.execute("UPDATE zeroth.runs SET payload = NULL WHERE run_id = %s", pending)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE zeroth.runs SET idempotency_key = 'key-1' WHERE run_id = %s",
                         pending)
        # A run enqueued, claimed and completed by the functions after the upgrade.
        run = conn.execute(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => 't')"
        ).fetchone()
        assert run is not None
        claimed = conn.execute(
            """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd',
                   tenant_id => 't', worker_id => 'after-0025', batch_size => 10)""").fetchall()
        mine = [c for c in claimed if c[0] == run[0]]
        assert len(mine) == 1
        done = conn.execute(
            """SELECT completed FROM zeroth.complete_runs(worker_id => 'after-0025',
                   run_ids => ARRAY[%s]::uuid[], generations => ARRAY[%s]::bigint[],
                   tenant_id => 't')""", mine[0]).fetchall()
        assert done == [(True,)]
        assert conn.execute(
            """SELECT worker_id, outcome FROM zeroth.run_attempts WHERE run_id = %s""", run
        ).fetchall() == [("after-0025", "completed")]
