"""Migration 0024 moves the columns of zeroth.runs that no claim nor completion writes to the end
of the row (payload, metadata, max_attempts, checkpoint_seq, hand_backs, resumable, progress,
accounting, created_at, run_after, priority, idempotency_key), so that both non-HOT updates leave
them out of their WAL record (prefix/suffix compression; issue 30). A database upgraded from 0023
WITH runs keeps every value of every run, the columns' defaults, NOT NULL, CHECK constraints and
comments, the indexes on them (built again, the same definitions and comments; the idempotency
key still unique), and the views and functions that read them (dropped and made again) answer as
before.
"""

from __future__ import annotations

import json

import psycopg
import pytest

from zeroth_pg import migrate

MOVED = ["max_attempts", "checkpoint_seq", "hand_backs", "resumable", "progress", "accounting",
         "metadata", "payload", "created_at", "run_after", "priority", "idempotency_key"]
VALUES = f"SELECT run_id, {', '.join(MOVED)} FROM zeroth.runs ORDER BY run_id"
SHAPE = """SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(d.adbin, d.adrelid), col_description(a.attrelid, a.attnum)
             FROM pg_attribute a
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = 'zeroth.runs'::regclass AND a.attnum > 0 AND NOT a.attisdropped
              AND a.attname = ANY (%s) ORDER BY a.attname"""
CHECKS = """SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = 'zeroth.runs'::regclass AND contype = 'c' ORDER BY 1"""
INDEXES = """SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid),
                    obj_description(indexrelid, 'pg_class')
               FROM pg_index WHERE indrelid = 'zeroth.runs'::regclass ORDER BY 1"""


def test_an_upgrade_from_0023_with_runs_moves_the_columns_and_keeps_every_value(
        empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, "0023")
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        for i, status in enumerate(("pending", "completed", "failed", "waiting")):
            conn.execute(
                """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, run_after,
                       created_at, updated_at, finished_at, max_attempts, checkpoint_seq,
                       hand_backs, resumable, progress, accounting, metadata, payload, priority,
                       idempotency_key)
                   VALUES (gen_random_uuid(), 't', 'd', %s, now() + %s * interval '1 minute',
                           now() - %s * interval '1 hour', now(),
                           CASE WHEN %s IN ('completed', 'failed') THEN now() END,
                           %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
                (status, i, i, status, 3 + i, 7 * i, i, i % 2 == 0,
                 json.dumps({"step": i}) if i else None, json.dumps({"tokens": 10 * i}),
                 json.dumps({"m": "x" * (100 * i)}), json.dumps({"p": i, "big": "y" * 3000}),
                 i - 1, f"key-{i}" if i % 2 else None))
        values = conn.execute(VALUES).fetchall()
        shape = conn.execute(SHAPE, (MOVED,)).fetchall()
        checks = conn.execute(CHECKS).fetchall()
        indexes = conn.execute(INDEXES).fetchall()
        # (the views are made by the function files, applied when an upgrade reaches head)
        listed = conn.execute(
            "SELECT run_id, payload, metadata, max_attempts, progress FROM zeroth.runs "
            "ORDER BY run_id").fetchall()
    assert len(values) == 4

    migrate.upgrade(empty_database_dsn)
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        assert conn.execute(VALUES).fetchall() == values
        assert conn.execute(SHAPE, (MOVED,)).fetchall() == shape
        assert conn.execute(CHECKS).fetchall() == checks
        assert conn.execute(INDEXES).fetchall() == indexes
        # The moved columns are the last of the row, after every column a claim or a completion
        # writes (completed_claimed_at was the last).
        order = [r[0] for r in conn.execute(
            """SELECT attname::text FROM pg_attribute
                WHERE attrelid = 'zeroth.runs'::regclass AND attnum > 0 AND NOT attisdropped
                ORDER BY attnum""").fetchall()]
        assert order[-len(MOVED):] == MOVED, order
        assert order.index("completed_claimed_at") < order.index(MOVED[0])
        # The views (dropped by 0024, made again by the function files) read the same values.
        assert conn.execute(
            "SELECT run_id, payload, metadata, max_attempts, progress FROM zeroth.run_list "
            "ORDER BY run_id").fetchall() == listed
        # Defaults and CHECKs still hold for a new run.
        run = conn.execute(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => 't')"
        ).fetchone()
        assert run is not None
        assert conn.execute(
            f"SELECT {', '.join(MOVED[:8])} FROM zeroth.runs WHERE run_id = %s", run
        ).fetchone() == (3, 0, 0, True, None, None, {}, {})
        # The idempotency key is still unique in its scope and deployment.
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE zeroth.runs SET idempotency_key = 'key-1' WHERE run_id = %s",
                         run)
        for column, bad in (("payload", "[]"), ("metadata", "1"), ("accounting", "[]")):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"UPDATE zeroth.runs SET {column} = %s::jsonb WHERE run_id = %s",
                             (bad, run[0]))
        for column, bad in (("max_attempts", 0), ("hand_backs", -1)):
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(f"UPDATE zeroth.runs SET {column} = %s WHERE run_id = %s",
                             (bad, run[0]))


# zeroth._scope_has_due_run as release 0022 made it (sql/functions/internal/scopes.sql of that
# release): a SQL-standard body, which PostgreSQL binds to the columns it reads (run_after among
# them) by dependencies, so no column it reads can be dropped while it exists. 0023's file made
# it PL/pgSQL, but a database upgraded from 0022 still holds the old one while the migrations
# run: the function files are applied after them.
SCOPE_HAS_DUE_RUN_0022 = """
CREATE OR REPLACE FUNCTION zeroth._scope_has_due_run(tenant_id text, workspace_key text,
                                                     deployment_ref text, at timestamptz,
                                                     serves bigint[] DEFAULT NULL)
    RETURNS boolean
    LANGUAGE sql STABLE
    RETURN EXISTS (
        SELECT 1 FROM zeroth.runs r
         WHERE r.tenant_id = _scope_has_due_run.tenant_id
           AND r.workspace_key = _scope_has_due_run.workspace_key
           AND r.deployment_ref = _scope_has_due_run.deployment_ref
           AND r.status = 'pending'
           AND r.run_after <= _scope_has_due_run.at
           AND (r.lease_expires_at IS NULL OR r.lease_expires_at < _scope_has_due_run.at)
           AND (_scope_has_due_run.serves IS NULL OR r.started_at IS NULL
                OR r.code_version_id IS NULL
                OR r.code_version_id = ANY (_scope_has_due_run.serves)));
ALTER FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz, bigint[])
    OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._scope_has_due_run(text, text, text, timestamptz, bigint[])
    FROM PUBLIC;
"""


def test_an_upgrade_from_0022_whose_functions_read_the_moved_columns_reaches_head(
        empty_database_dsn: str, database_dsn: str) -> None:
    """A database of release 0022 holds that release's function files, among them SQL-standard
    bodies that read the columns 0024 moves (zeroth._scope_has_due_run reads run_after): 0024's
    DROP COLUMN failed on them ('cannot drop column run_after of table zeroth.runs because
    other objects depend on it'), so no database of release 0022 could be upgraded."""
    from schema_catalog import differences, snapshot

    migrate.upgrade(empty_database_dsn, "0022")
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        conn.execute(SCOPE_HAS_DUE_RUN_0022)
        conn.execute(
            """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, run_after,
                   created_at, updated_at, payload)
               VALUES (gen_random_uuid(), 't', 'd', 'pending', now(), now(), now(),
                       '{"kept": true}')""")
    migrate.upgrade(empty_database_dsn)
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
    assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT payload FROM zeroth.runs").fetchall() == [({"kept": True},)]
        assert conn.execute(
            "SELECT zeroth._scope_has_due_run('t', '', 'd', clock_timestamp())").fetchone() \
            == (True,)
