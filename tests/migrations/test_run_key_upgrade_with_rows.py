"""Migration 0023 rebuilds zeroth.runs' primary key (run_id first) and drops and re-adds the five
foreign keys that reference it. A database upgraded from 0022 WITH rows in every referencing table
keeps every row, every foreign key as it was (columns, ON DELETE CASCADE, validated, not
deferrable), every grant of the tables, and its cascades still stop at the run's own scope, also
when two scopes hold the same run_id (run_id is unique per scope only, before and after).
"""

from __future__ import annotations

import psycopg

from zeroth_pg import migrate

A = "11111111-1111-1111-1111-111111111111"
B = "22222222-2222-2222-2222-222222222222"
SCOPES = (("t1", None), ("t2", "w"))  # the same run_id A in both scopes; B only in t1

FKEYS = """SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated,
                  confdeltype::text, condeferrable, confrelid::regclass::text
             FROM pg_constraint
            WHERE contype = 'f' AND confrelid = 'zeroth.runs'::regclass ORDER BY 1, 2"""
ACLS = """SELECT relname, relacl::text, relrowsecurity FROM pg_class
           WHERE relnamespace = 'zeroth'::regnamespace
             AND relname IN ('runs', 'checkpoints', 'child_runs', 'event_waits', 'run_events',
                             'run_steps') ORDER BY 1"""
COUNTS = """SELECT (SELECT count(*) FROM zeroth.runs), (SELECT count(*) FROM zeroth.checkpoints),
                   (SELECT count(*) FROM zeroth.child_runs),
                   (SELECT count(*) FROM zeroth.event_waits),
                   (SELECT count(*) FROM zeroth.run_events),
                   (SELECT count(*) FROM zeroth.run_steps)"""


def _fill(conn: psycopg.Connection) -> None:
    for tenant, workspace in SCOPES:
        for run_id in (A, B) if tenant == "t1" else (A,):
            conn.execute(
                """INSERT INTO zeroth.runs (run_id, tenant_id, workspace_id, deployment_ref,
                                            status, run_after, created_at, updated_at)
                   VALUES (%s, %s, %s, 'd', 'waiting', now(), now(), now())""",
                (run_id, tenant, workspace))
            key = conn.execute(
                "SELECT workspace_key FROM zeroth.runs WHERE run_id = %s AND tenant_id = %s",
                (run_id, tenant)).fetchone()
            assert key is not None
            scope = (tenant, key[0], run_id)
            conn.execute(
                """INSERT INTO zeroth.checkpoints (checkpoint_id, tenant_id, workspace_key, run_id,
                       checkpoint_order, lease_generation, data, created_at)
                   VALUES (gen_random_uuid(), %s, %s, %s, 1, 1, '{}', now())""", scope)
            conn.execute(
                """INSERT INTO zeroth.child_runs (tenant_id, workspace_key, parent_run_id,
                       step_key, child_run_id, deployment_ref, payload, detached, created_at)
                   VALUES (%s, %s, %s, 's', gen_random_uuid(), 'd', '{}', false, now())""", scope)
            conn.execute(
                """INSERT INTO zeroth.event_waits (tenant_id, workspace_key, run_id, step_key,
                       name, created_at) VALUES (%s, %s, %s, 's', 'e', now())""", scope)
            conn.execute(
                """INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id,
                       kind, name, data, lease_generation, created_at)
                   VALUES (%s, %s, %s, 1, 'event', 'n', '{}', 1, now())""", scope)
            conn.execute(
                """INSERT INTO zeroth.run_steps (tenant_id, workspace_key, run_id, step_key,
                       result, lease_generation, attempt, recorded_at)
                   VALUES (%s, %s, %s, 's', '{}', 1, 1, now())""", scope)


def test_an_upgrade_from_0022_with_rows_keeps_them_and_every_foreign_key(
        empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn, "0022")
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        _fill(conn)
        fkeys, acls, counts = (conn.execute(FKEYS).fetchall(), conn.execute(ACLS).fetchall(),
                               conn.execute(COUNTS).fetchone())
    assert counts == (3, 3, 3, 3, 3, 3)
    assert len(fkeys) == 5
    assert all(row[3] and row[4] == "c" and not row[5] for row in fkeys), fkeys

    migrate.upgrade(empty_database_dsn)
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        # Every row, every foreign key (as it was: columns, cascade, validated) and every grant.
        assert conn.execute(COUNTS).fetchone() == counts
        assert conn.execute(FKEYS).fetchall() == fkeys
        assert conn.execute(ACLS).fetchall() == acls
        assert conn.execute(
            """SELECT array_agg(a.attname::text ORDER BY k.n)
                 FROM pg_constraint c, unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
                 JOIN pg_attribute a ON a.attrelid = 'zeroth.runs'::regclass
                                    AND a.attnum = k.attnum
                WHERE c.conname = 'runs_pkey'""").fetchone() == (
            ["run_id", "tenant_id", "workspace_key"],)
        # A row of another scope's run is still refused by each foreign key: run B is t1's only.
        for table, column in (("checkpoints", "run_id"), ("run_steps", "run_id"),
                              ("child_runs", "parent_run_id"), ("event_waits", "run_id"),
                              ("run_events", "run_id")):
            try:
                with conn.transaction():
                    conn.execute(
                        f"""UPDATE zeroth.{table} SET tenant_id = 't2',
                                   workspace_key = (SELECT workspace_key FROM zeroth.runs
                                                     WHERE tenant_id = 't2')
                             WHERE tenant_id = 't1' AND {column} = %s""".encode(), (B,))
            except psycopg.errors.ForeignKeyViolation:
                pass
            else:
                raise AssertionError(f"{table}: a row moved to a scope without its run")
        # Deleting t1's run A cascades to t1's rows only: t2's run A keeps all of its own.
        conn.execute("DELETE FROM zeroth.runs WHERE tenant_id = 't1' AND run_id = %s", (A,))
        for table, column in (("checkpoints", "run_id"), ("run_steps", "run_id"),
                              ("child_runs", "parent_run_id"), ("event_waits", "run_id"),
                              ("run_events", "run_id")):
            rows = conn.execute(
                f"SELECT tenant_id, count(*) FROM zeroth.{table} WHERE {column} = %s "
                f"GROUP BY 1 ORDER BY 1".encode(), (A,)).fetchall()
            assert rows == [("t2", 1)], (table, rows)
