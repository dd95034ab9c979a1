"""Code in sql/functions, state in sql/migrations: every upgrade path ends where a fresh install
does, object for object in the catalog, and each function file is the whole truth about its
function.

A database installed by an older release (tests/migrations/released/: the migration files as
they were released, functions included) and upgraded to head must be catalog-identical to a fresh
install, through alembic and through the psql upgrade script alike.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest
from roles import dsn_as, login_role, planted_equals_operator
from schema_catalog import differences, install_released, released_revisions, snapshot

from zeroth_pg import _migrate_functions, migrate
from zeroth_pg._paths import sql_functions_dir
from zeroth_pg.testing import libpq_dsn, psql_executable, run_psql

CREATE = re.compile(
    r"^CREATE OR REPLACE (FUNCTION|VIEW|TRIGGER) (?:zeroth\.)?(\w+)", re.MULTILINE)


def _definitions() -> dict[str, list[Path]]:
    """name → the files that CREATE OR REPLACE it (functions, views, triggers)."""
    found: dict[str, list[Path]] = {}
    for path in migrate.function_files():
        for _kind, name in CREATE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(path)
    return found


class TestUpgradesEndAtAFreshInstall:
    @pytest.mark.parametrize("revision", released_revisions())
    def test_alembic_from_a_released_revision(self, revision: str, empty_database_dsn: str,
                                              database_dsn: str) -> None:
        install_released(empty_database_dsn, revision)
        assert migrate.current_revision(empty_database_dsn) == revision
        migrate.upgrade(empty_database_dsn)
        assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
        assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []

    @pytest.mark.parametrize("revision", released_revisions())
    def test_psql_upgrade_script_from_a_released_revision(
            self, revision: str, empty_database_dsn: str, database_dsn: str) -> None:
        install_released(empty_database_dsn, revision)
        run_psql(empty_database_dsn, migrate.upgrade_sql(revision))
        assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
        assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []

    def test_psql_install_script_is_a_fresh_install(self, empty_database_dsn: str,
                                                    database_dsn: str) -> None:
        run_psql(empty_database_dsn, migrate.upgrade_sql(None))
        assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []

    def test_upgrade_script_refuses_a_database_at_another_revision(
            self, empty_database_dsn: str) -> None:
        install_released(empty_database_dsn, "0006")
        before = snapshot(empty_database_dsn)
        result = run_psql(empty_database_dsn, migrate.upgrade_sql("0005"), check=False)
        assert result.returncode != 0
        assert "upgrades a database at revision 0005" in result.stderr
        assert differences(snapshot(empty_database_dsn), before) == []

    def test_upgrade_script_refuses_an_unknown_revision(self) -> None:
        with pytest.raises(ValueError, match="unknown revision"):
            migrate.upgrade_sql("0042'; DROP SCHEMA zeroth CASCADE; --")


class TestReapplication:
    def test_a_current_database_is_unchanged_by_another_upgrade(self, database_dsn: str) -> None:
        before = snapshot(database_dsn)
        migrate.upgrade(database_dsn)
        assert differences(snapshot(database_dsn), before) == []

    def test_an_upgrade_restores_a_function_a_dba_changed_by_hand(self, database_dsn: str) -> None:
        # The files are the truth: a manual CREATE OR REPLACE, a lost grant or comment is drift
        # that the next upgrade repairs (and the snapshot is able to see it).
        before = snapshot(database_dsn)
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute("CREATE OR REPLACE FUNCTION zeroth._now() RETURNS timestamptz "
                         "LANGUAGE sql VOLATILE RETURN now()")
            conn.execute("REVOKE EXECUTE ON FUNCTION zeroth.claim_and_start FROM zeroth_worker")
            conn.execute("COMMENT ON VIEW zeroth.queue_depth IS NULL")
        changed = differences(snapshot(database_dsn), before)
        assert any("zeroth._now()" in line for line in changed)
        assert any("claim_and_start" in line for line in changed)
        assert any("queue_depth" in line for line in changed)
        migrate.upgrade(database_dsn)
        assert differences(snapshot(database_dsn), before) == []

    def test_an_upgrade_that_stops_short_of_head_leaves_functions_alone(
            self, empty_database_dsn: str) -> None:
        # The files are written for the head schema; an older schema gets none of them.
        migrate.upgrade(empty_database_dsn, "0007")
        with psycopg.connect(empty_database_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM pg_proc "
                               "WHERE pronamespace = 'zeroth'::regnamespace").fetchone()
        assert row == (0,)

    def test_a_failing_file_changes_nothing(self, database_dsn: str,
                                            monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
        copy = tmp_path / "functions"
        shutil.copytree(sql_functions_dir(), copy)
        broken = copy / "views" / "table_health.sql"
        broken.write_text(broken.read_text(encoding="utf-8") + "\nSELECT 1/0;\n",
                          encoding="utf-8")
        (copy / "internal" / "clock.sql").write_text(
            "CREATE OR REPLACE FUNCTION zeroth._now() RETURNS timestamptz "
            "LANGUAGE sql VOLATILE RETURN now();\n", encoding="utf-8")
        monkeypatch.setattr(_migrate_functions, "sql_functions_dir", lambda: copy)
        before = snapshot(database_dsn)
        with pytest.raises(Exception, match="division by zero"):
            migrate.upgrade(database_dsn)
        assert differences(snapshot(database_dsn), before) == []


class TestOneFilePerFunction:
    def test_order_lists_every_file_once(self, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
        assert migrate.function_files()
        copy = tmp_path / "functions"
        shutil.copytree(sql_functions_dir(), copy)
        monkeypatch.setattr(_migrate_functions, "sql_functions_dir", lambda: copy)
        (copy / "stray.sql").write_text("SELECT 1;\n", encoding="utf-8")
        with pytest.raises(ValueError, match=r"present but not listed \['stray.sql'\]"):
            migrate.function_files()
        (copy / "stray.sql").unlink()
        order = copy / "order.txt"
        order.write_text(order.read_text(encoding="utf-8") + "claim_pending.sql\nmissing.sql\n",
                         encoding="utf-8")
        with pytest.raises(ValueError, match=r"repeated \['claim_pending.sql'\].*missing.sql"):
            migrate.function_files()

    def test_every_catalog_function_and_view_has_exactly_one_file(self,
                                                                  database_dsn: str) -> None:
        with psycopg.connect(database_dsn) as conn:
            names = [r[0] for r in conn.execute(
                """SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace
                   UNION ALL
                   SELECT c.relname FROM pg_class c
                    WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind = 'v'
                   UNION ALL
                   SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
                    WHERE c.relnamespace = 'zeroth'::regnamespace AND NOT t.tgisinternal""")]
        definitions = _definitions()
        assert sorted(names) == sorted(definitions), "catalog and files name different objects"
        assert {n: [p.name for p in ps] for n, ps in definitions.items() if len(ps) > 1} == {}

    def test_each_public_function_has_its_own_file_named_after_it(self) -> None:
        for name, (path,) in _definitions().items():
            if not name.startswith("_") and path.parent.name != "views" and path.name != (
                    "triggers.sql"):
                assert path.name == f"{name}.sql", (name, path)

    def test_each_file_states_owner_privileges_and_comment(self, database_dsn: str) -> None:
        with psycopg.connect(database_dsn) as conn:
            granted = {r[0] for r in conn.execute(
                """SELECT p.proname FROM pg_proc p
                    WHERE p.pronamespace = 'zeroth'::regnamespace
                      AND has_function_privilege('zeroth_worker', p.oid, 'EXECUTE')""")}
        for path in migrate.function_files():
            text = path.read_text(encoding="utf-8")
            for kind, name in CREATE.findall(text):
                if kind == "TRIGGER":
                    continue
                what = "FUNCTION" if kind == "FUNCTION" else "VIEW"
                signature = rf"zeroth\.{name}\b(\([^)]*\))?"
                for statement in (rf"COMMENT ON {what} {signature} IS",
                                  rf"ALTER {what} {signature} OWNER TO zeroth_owner;",
                                  rf"REVOKE ALL ON (FUNCTION )?{signature} FROM PUBLIC;"):
                    assert re.search(statement, text), (path.name, name, statement)
                grant = re.search(rf"GRANT EXECUTE ON FUNCTION {signature} TO zeroth_worker;",
                                  text)
                if kind == "FUNCTION":
                    assert bool(grant) == (name in granted), (path.name, name)
                if kind == "FUNCTION" and not name.startswith("_"):
                    header = text[: text.index(f"CREATE OR REPLACE FUNCTION zeroth.{name}(")]
                    assert header.rstrip().splitlines()[-1].startswith("--"), (
                        f"{path.name}: {name} has no header comment")

    def test_migrations_hold_no_code(self) -> None:
        code = re.compile(r"^\s*CREATE (OR REPLACE )?(FUNCTION|PROCEDURE|VIEW|TRIGGER)\b",
                          re.IGNORECASE | re.MULTILINE)
        for path in migrate.sql_files():
            assert not code.search(path.read_text(encoding="utf-8")), path.name

    def test_function_files_do_not_manage_transactions(self) -> None:
        pattern = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK)\s*;", re.IGNORECASE | re.MULTILINE)
        for path in migrate.function_files():
            assert not pattern.search(path.read_text(encoding="utf-8")), path.name


class TestAHostileSessionAroundAnUpgrade:
    """What a session with no zeroth privilege could do to an upgrade."""

    HIJACK = """
        CREATE FUNCTION public.hijacked_lt(double precision, numeric) RETURNS boolean
            LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked operator ran'; END$$;
        CREATE OPERATOR public.< (LEFTARG = double precision, RIGHTARG = numeric,
                                  FUNCTION = public.hijacked_lt);
        CREATE FUNCTION public.hijacked_eq(zeroth.run_status, zeroth.run_status) RETURNS boolean
            LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'hijacked operator ran'; END$$;
        CREATE OPERATOR public.= (LEFTARG = zeroth.run_status, RIGHTARG = zeroth.run_status,
                                  FUNCTION = public.hijacked_eq)"""

    @staticmethod
    def bound_to_public(dsn: str) -> list[str]:
        """zeroth objects whose definitions depend on anything in schema public."""
        with psycopg.connect(dsn) as conn:
            return [r[0] for r in conn.execute(
                """SELECT DISTINCT d.classid::regclass::text || ' ' || d.objid::text
                     FROM pg_depend d
                     JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass
                                       AND o.oid = d.refobjid
                    WHERE o.oprnamespace = 'public'::regnamespace""")]

    @pytest.mark.parametrize("how", ["alembic", "psql"])
    def test_an_operator_planted_in_public_is_bound_into_no_function_or_view(
            self, how: str, empty_database_dsn: str) -> None:
        # A database carried over from PostgreSQL 14 or older: public is writable by everyone,
        # and the migrating session's search_path is the default ("$user", public). The
        # stranger plants operators that would be exact matches where the bodies compare a float
        # with a numeric (the NOTIFY guard) or two statuses; the install binds none of them.
        install_released(empty_database_dsn, "0006")  # zeroth.run_status exists, functions too
        with psycopg.connect(empty_database_dsn, autocommit=True) as admin:
            admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        # A zeroth_worker member: USAGE on schema zeroth lets it name zeroth.run_status.
        with login_role(empty_database_dsn, "zeroth_worker") as (name, password), psycopg.connect(
                dsn_as(empty_database_dsn, name, password), autocommit=True) as stranger:
            stranger.execute(self.HIJACK)
            if how == "alembic":
                migrate.upgrade(empty_database_dsn)
            else:
                run_psql(empty_database_dsn, migrate.upgrade_sql("0006"))
            assert self.bound_to_public(empty_database_dsn) == []
            with psycopg.connect(empty_database_dsn, autocommit=True) as worker:
                status = worker.execute(  # compares statuses, and notifies through the guard
                    "SELECT status::text FROM zeroth.enqueue_run(deployment_ref => 'd')"
                ).fetchone()
            assert status == ("pending",)


class TestAnUpgradeWithNothingToDo:
    def test_takes_no_lock_that_idle_sessions_hold(self, database_dsn: str) -> None:
        # An upgrade with nothing to do re-creates neither the trigger nor the views: that would
        # wait for any session idle in a transaction that had touched them (a worker after one
        # call, a reader after one look), and every other call would queue behind the upgrade.
        with psycopg.connect(database_dsn) as worker, psycopg.connect(database_dsn) as reader:
            worker.execute("SELECT zeroth.enqueue_run(deployment_ref => 'd')")  # left open
            reader.execute("SELECT count(*) FROM zeroth.queue_depth")  # left open
            before = snapshot(database_dsn)
            with psycopg.connect(database_dsn) as conn:
                applied = conn.execute("SELECT applied_at FROM zeroth.code_version").fetchone()
            done = threading.Event()
            upgrade = threading.Thread(target=lambda: (migrate.upgrade(database_dsn),
                                                       done.set()), daemon=True)
            upgrade.start()
            upgrade.join(timeout=60)
            assert done.is_set(), "the upgrade waited for the idle sessions"
            with psycopg.connect(database_dsn) as conn:
                assert conn.execute("SELECT applied_at FROM zeroth.code_version").fetchone() == (
                    applied)
            assert differences(snapshot(database_dsn), before) == []


class TestAnUpgradeIsOneStepForCallers:
    def test_callers_never_see_the_schema_between_migrations_and_functions(
            self, empty_database_dsn: str) -> None:
        # 0008 drops every function of 0002-0007 and the files put them back: one commit, or
        # every call in between would fail (42883: no such function).
        install_released(empty_database_dsn, "0007")
        errors: list[str] = []
        calls = 0
        stop = threading.Event()

        def poll() -> None:
            nonlocal calls
            with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
                while not stop.is_set():
                    try:
                        conn.execute("SELECT zeroth.count_pending(deployment_ref => 'd')")
                    except psycopg.Error as exc:
                        errors.append(exc.sqlstate or "?")
                    calls += 1

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            migrate.upgrade(empty_database_dsn)
        finally:
            stop.set()
            poller.join(timeout=30)
        assert calls > 0
        # One call may race the commit itself (its function's old definition is gone when it
        # runs: XX000); none finds the functions missing.
        assert "42883" not in errors, errors
        assert len(errors) <= 1, errors


class TestTheUpgradeSession:
    """The upgrade's own session, before and around the function files."""

    def test_alembics_own_queries_bind_no_operator_a_stranger_planted(
            self, empty_database_dsn: str) -> None:
        # alembic looks for its version table with `relname IN ($1::VARCHAR)`: PostgreSQL has no
        # =(name, varchar), so a public one is an exact match, and it ran as the superuser that
        # migrates. The connection pins search_path with its first statement (a SET: PgBouncer
        # refuses a startup `options`; tests/migrations/test_through_pgbouncer.py).
        with planted_equals_operator(empty_database_dsn):
            migrate.upgrade(empty_database_dsn)  # a fresh install
            migrate.upgrade(empty_database_dsn)  # and one with nothing to do
        assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()

    def test_the_digest_does_not_depend_on_the_upgrading_sessions_settings(
            self, database_dsn: str) -> None:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            applied = conn.execute("SELECT applied_at FROM zeroth.code_version").fetchone()
            name = conn.execute("SELECT current_database()").fetchone()
            assert name is not None
            conn.execute(f'ALTER DATABASE "{name[0]}" SET IntervalStyle = iso_8601')
            conn.execute(f'ALTER DATABASE "{name[0]}" SET quote_all_identifiers = on')
        migrate.upgrade(database_dsn)
        with psycopg.connect(database_dsn) as conn:
            assert conn.execute("SELECT applied_at FROM zeroth.code_version").fetchone() == (
                applied)

    def test_an_older_package_does_not_put_older_code_back(
            self, database_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
        # A lagging host of a rolling deploy that upgrades at startup: it neither reverts the
        # newer functions nor fails (old and new workers overlap); the psql script refuses.
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute("UPDATE zeroth.code_version SET package_version = '99.0.0', "
                         "files_sha256 = 'from a newer package'")
        before = snapshot(database_dsn)
        with caplog.at_level("WARNING", logger="zeroth_pg.migrate"):
            migrate.upgrade(database_dsn)
        assert "99.0.0" in caplog.text
        assert differences(snapshot(database_dsn), before) == []
        result = run_psql(database_dsn, migrate.upgrade_sql(migrate.head_revision()),
                          check=False)
        assert result.returncode != 0
        assert "would put older code back" in result.stderr
        assert differences(snapshot(database_dsn), before) == []

    def test_a_relative_target_is_refused(self, database_dsn: str) -> None:
        with pytest.raises(ValueError, match="revision id"):
            migrate.upgrade(database_dsn, "+1")

    def test_a_real_reapply_gives_way_to_an_idle_reader_and_lets_writers_through(
            self, database_dsn: str) -> None:
        # New function files (simulated: another recorded digest) must replace the views; a
        # reader idle in a transaction holds one. Each attempt waits at most 500 ms for it, then
        # rolls back and lets go of zeroth.runs, so writers go on; once the reader ends, an
        # attempt succeeds. Before, the retry never ran (psycopg's error is no DBAPIError) and
        # the first attempt failed the upgrade.
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute("UPDATE zeroth.code_version SET files_sha256 = 'older files'")
        outcome: list[BaseException | None] = []

        def upgrade() -> None:
            try:
                migrate.upgrade(database_dsn)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        with psycopg.connect(database_dsn) as reader, psycopg.connect(
                database_dsn, autocommit=True) as writer:
            reader.execute("SELECT count(*) FROM zeroth.queue_depth")  # left open
            thread = threading.Thread(target=upgrade, daemon=True)
            thread.start()
            # Long enough for attempts to have met the reader's lock (500 ms each) and given way;
            # before, the first attempt held zeroth.runs while it waited 5 s, then failed.
            time.sleep(2.0)
            for _ in range(3):  # writers get through while the upgrade keeps giving way
                writer.execute("SET statement_timeout = '20s'")
                writer.execute("SELECT zeroth.enqueue_run(deployment_ref => 'd')")
            assert outcome == []  # still trying: the reader is still open
            reader.rollback()
            thread.join(timeout=120)
        assert outcome == [None]
        with psycopg.connect(database_dsn) as conn:
            recorded = conn.execute("SELECT files_sha256 FROM zeroth.code_version").fetchone()
        assert recorded == (migrate.functions_digest(),)


class TestUpgradeTargetsAndTheUpgradeLock:
    """An upgrade to "heads" is an upgrade to head; a stranger holding the upgrade lock is named
    while the upgrade waits; the psql script at head takes no lock idle sessions hold and gives
    up on a held lock instead of parking."""

    def test_heads_is_head(self, empty_database_dsn: str, database_dsn: str) -> None:
        # "heads" came to env.py as a tuple and took the partial path: stamped head, no
        # function files, and 0008 had dropped every function.
        install_released(empty_database_dsn, "0007")
        migrate.upgrade(empty_database_dsn, "heads")
        assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []

    def test_a_stranger_holding_the_upgrade_lock_is_named_while_the_upgrade_waits(
            self, database_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
        # Any role can take any advisory lock: the upgrade cannot tell a stranger from a
        # concurrent upgrade and waits, but says who holds the key instead of hanging mutely.
        done = threading.Event()
        with login_role(database_dsn, None) as (name, password), psycopg.connect(
                dsn_as(database_dsn, name, password), autocommit=True) as stranger:
            stranger.execute("SELECT pg_advisory_lock(%s)", (migrate.ADVISORY_LOCK_KEY,))
            with caplog.at_level("WARNING", logger="zeroth_pg.migrate"):
                thread = threading.Thread(
                    target=lambda: (migrate.upgrade(database_dsn), done.set()), daemon=True)
                thread.start()
                for _ in range(200):
                    if name in caplog.text:
                        break
                    time.sleep(0.05)
                assert name in caplog.text, caplog.text
                assert not done.is_set()
                stranger.execute("SELECT pg_advisory_unlock(%s)", (migrate.ADVISORY_LOCK_KEY,))
                thread.join(timeout=60)
        assert done.is_set()

    def test_the_psql_script_at_head_skips_the_files_and_takes_no_lock_idle_sessions_hold(
            self, database_dsn: str) -> None:
        with psycopg.connect(database_dsn) as worker:
            worker.execute("SELECT zeroth.enqueue_run(deployment_ref => 'd')")  # left open
            result = run_psql(database_dsn, migrate.upgrade_sql(migrate.head_revision()),
                              check=False)
        assert result.returncode == 0, result.stderr
        assert "already applied" in result.stdout

    def test_the_psql_script_gives_up_on_a_held_lock_instead_of_parking(
            self, database_dsn: str) -> None:
        # New files must replace the views; a reader holds one. The script waits at most 2 s
        # (lock_timeout) and fails as a whole, rather than queueing every writer behind it.
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute("UPDATE zeroth.code_version SET files_sha256 = 'older files'")
        before = snapshot(database_dsn)
        with psycopg.connect(database_dsn) as reader:
            reader.execute("SELECT count(*) FROM zeroth.queue_depth")  # left open
            result = run_psql(database_dsn, migrate.upgrade_sql(migrate.head_revision()),
                              check=False)
        assert result.returncode != 0
        assert "lock timeout" in result.stderr
        assert differences(snapshot(database_dsn), before) == []


class TestThePsqlScriptWhateverPsqlIsToldElsewhere:
    def test_on_error_rollback_and_no_on_error_stop_cannot_commit_a_refused_script(
            self, empty_database_dsn: str) -> None:
        # With ON_ERROR_ROLLBACK on (a common psqlrc) and no ON_ERROR_STOP, psql would roll back
        # each failing statement alone and commit the rest: the revision guard, the
        # older-package refusal and a lock-timed-out trigger skipped and a broken catalog
        # recorded as applied. The script sets both itself.
        install_released(empty_database_dsn, "0007")
        before = snapshot(empty_database_dsn)
        result = subprocess.run(
            [psql_executable(), "-X", "-q", "-v", "ON_ERROR_ROLLBACK=on",
             libpq_dsn(empty_database_dsn)],
            input=migrate.upgrade_sql("0006"), capture_output=True, text=True)
        assert result.returncode != 0
        assert "upgrades a database at revision 0006" in result.stderr
        assert migrate.current_revision(empty_database_dsn) == "0007"
        assert differences(snapshot(empty_database_dsn), before) == []
