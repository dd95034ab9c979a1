"""The ``zeroth-pg`` command against a fresh test database.

Each test points the command at ``database_dsn`` through ``ZEROTH_PG_DSN`` and checks exit codes,
``--json`` output and what changed in the database. Runs are set up through the SQL API
(helpers.make_run); times are placed with ``now_override`` relative to the database clock.

:func:`cli` runs the command line in this process (the root ``app``, as the console script calls
it: its exit codes, its stdin, stdout and stderr, its ``ZEROTH_PG_*`` environment), which costs a
few milliseconds instead of a new interpreter importing typer, rich and asyncpg (about 0.4 CPU
seconds a call); ``cli(..., process=True)`` runs ``python -m zeroth_pg.cli`` as a subprocess, and
every command family keeps at least one test that does (the console script, the ``python -m``
aliases, and the worker, web, metrics, demo and db commands always do).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import typer
from helpers import make_run
from rich.console import Console
from roles import dsn_as, login_role

from zeroth_pg import demo, migrate
from zeroth_pg.cli import app, parse_duration
from zeroth_pg.client import LeaseManager

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0  # generous bound for any awaited condition; tests finish far sooner

# Options that carry the values of one call, not settings: they have no ZEROTH_PG_* fallback
# (an idempotency key or a payload taken from the environment would apply to every call).
PER_CALL_OPTIONS = {"payload", "priority", "run_after", "max_attempts", "idempotency_key",
                    "metadata", "batch", "status", "watch", "action", "help", "from_revision",
                    "from_database", "cron", "every", "tz", "catch_up", "grace", "paused",
                    "max_concurrency", "weight", "rate_limit", "note", "max_starts", "per",
                    "changes", "managed_by", "retry_base_seconds", "retry_max_seconds",
                    "lease_seconds", "unset", "attempt_timeout_seconds", "run_timeout_seconds"}


def cli(*args: str, dsn: str | None = None, stdin: str | None = None,
        env: dict[str, str] | None = None, timeout: float = DEADLINE,
        process: bool = False) -> subprocess.CompletedProcess[str]:
    """``zeroth-pg ARGS`` with no ZEROTH_PG_* setting but the ones given: in this process, or
    (``process``) as ``python -m zeroth_pg.cli ARGS``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    clean["COLUMNS"] = "200"
    if dsn is not None:
        clean["ZEROTH_PG_DSN"] = dsn
    clean.update(env or {})
    if not process:
        return _in_process(list(args), clean, stdin, timeout)
    return subprocess.run([sys.executable, "-m", "zeroth_pg.cli", *args], cwd=REPO,
                          env=clean, input=stdin, capture_output=True, text=True,
                          timeout=timeout)


_ONE_AT_A_TIME = threading.Lock()  # the process's environment and standard streams are shared


def _set_environ(environ: dict[str, str]) -> None:
    """Make os.environ ``environ`` key by key (never empty for other threads meanwhile)."""
    for key in [key for key in os.environ if key not in environ]:
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _in_process(args: list[str], environ: dict[str, str], stdin: str | None,
                timeout: float) -> subprocess.CompletedProcess[str]:
    """The root command line called as the console script calls it (``app(prog_name=...)``:
    its exceptions mapped to exit codes, ``sys.exit`` ending it) on a thread of its own (a
    command runs its own event loop, and the calling test may be inside one), with the
    environment ``environ`` and its standard streams captured."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code: list[int] = []

    def run() -> None:
        try:
            app(args=args, prog_name="zeroth-pg")
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code.append(1 if isinstance(exc.code, str) else exc.code or 0)
        else:
            code.append(0)

    with _ONE_AT_A_TIME:
        saved_environ, saved_hook = dict(os.environ), sys.excepthook
        saved_streams = sys.stdin, sys.stdout, sys.stderr
        try:
            _set_environ(environ)
            sys.stdin = io.StringIO(stdin or "")
            sys.stdout, sys.stderr = stdout, stderr
            thread = threading.Thread(target=run, name="zeroth-pg-cli", daemon=True)
            thread.start()
            thread.join(timeout)
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            _set_environ(saved_environ)
            sys.excepthook = saved_hook  # typer installs its own
    if thread.is_alive():
        raise subprocess.TimeoutExpired(["zeroth-pg", *args], timeout)
    assert code, f"zeroth-pg {args} ended without an exit code: {stderr.getvalue()}"
    return subprocess.CompletedProcess(["zeroth-pg", *args], code[0], stdout.getvalue(),
                                       stderr.getvalue())


def ok_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def db_now(conn: asyncpg.Connection) -> datetime:
    return await conn.fetchval("SELECT clock_timestamp()")  # type: ignore[no-any-return]


def _options(command: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every option of every command under ``command`` (typer's click, vendored or not)."""
    found = []
    for name, sub in getattr(command, "commands", {}).items():
        found += _options(sub, f"{path} {name}")
    for param in command.params:
        if param.param_type_name == "option":
            found.append((path.strip(), param))
    return found


class TestHelp:
    def test_every_setting_option_has_a_zeroth_pg_environment_fallback(self):
        options = _options(typer.main.get_command(app))
        assert len(options) > 30
        missing = [f"{where} --{opt.name}" for where, opt in options
                   if opt.name not in PER_CALL_OPTIONS
                   and not str(opt.envvar or "").startswith("ZEROTH_PG_")]
        assert missing == []

    def test_help_names_the_environment_variables_and_exit_codes(self):
        root = cli("--help")
        assert root.returncode == 0
        assert "Exit codes" in root.stdout
        for command in ("migrate", "verify", "worker", "enqueue", "runs", "status", "prune",
                        "demo", "db"):
            assert command in root.stdout
        assert "bench" not in root.stdout  # python -m bench, in a checkout
        runs_list = cli("runs", "list", "--help")
        assert runs_list.returncode == 0
        for env in ("ZEROTH_PG_DSN", "ZEROTH_PG_TENANT", "ZEROTH_PG_WORKSPACE", "ZEROTH_PG_JSON",
                    "ZEROTH_PG_DEPLOYMENT", "ZEROTH_PG_LIMIT"):
            assert env in runs_list.stdout

    def test_worker_and_demo_help_name_their_environment_variables(self):
        worker = cli("worker", "--help")
        assert worker.returncode == 0
        assert "Usage: zeroth-pg worker" in worker.stdout
        for env in ("ZEROTH_PG_APP", "ZEROTH_PG_DEPLOYMENT", "ZEROTH_PG_CONCURRENCY",
                    "ZEROTH_PG_LEASE_SECONDS", "ZEROTH_PG_WORKER_ID", "ZEROTH_PG_LOG_LEVEL"):
            assert env in worker.stdout
        demo_help = cli("demo", "--help")
        assert demo_help.returncode == 0
        assert "ZEROTH_PG_DEMO_RUNS" in demo_help.stdout

    def test_the_python_m_aliases_are_the_same_commands(self):
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
        for module in ("zeroth_pg.worker", "zeroth_pg.demo"):
            result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO,
                                    env={**clean, "COLUMNS": "200"}, capture_output=True,
                                    text=True, timeout=DEADLINE)
            assert result.returncode == 0, result.stderr
            assert f"Usage: python -m {module}" in result.stdout

    def test_bench_is_not_a_command(self):
        assert cli("bench", "--help").returncode == 2

    def test_console_script_is_installed(self):
        script = Path(sys.executable).parent / "zeroth-pg"
        result = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                                timeout=DEADLINE)
        assert result.returncode == 0, result.stderr
        assert "Usage: zeroth-pg" in result.stdout


class TestUsageErrors:
    def test_bad_arguments_exit_2_before_touching_a_database(self):
        nowhere = "postgresql://nobody@/nowhere?host=/nonexistent"
        assert cli("enqueue", "--deployment", "d", "--payload", "[1]", dsn=nowhere).returncode == 2
        assert cli("runs", "show", "not-a-uuid", dsn=nowhere).returncode == 2
        assert cli("prune", "--older-than", "7x", dsn=nowhere).returncode == 2

    @pytest.mark.parametrize("worker_id", ["", "w" * 201])
    def test_a_worker_id_every_claim_would_refuse_exits_2_before_touching_a_database(
            self, worker_id: str):
        nowhere = "postgresql://nobody@/nowhere?host=/nonexistent"
        result = cli("worker", "--app", "zeroth_pg.demo:handle", "--deployment", "d",
                     "--worker-id", worker_id, dsn=nowhere)
        assert result.returncode == 2
        assert "--worker-id" in result.stderr
        assert "1 to 200 characters" in result.stderr

    @pytest.mark.parametrize(("options", "says"), [
        (("--claim-ahead", "9"), "from 0 to max_concurrency (8)"),
        (("--claim-ahead", "-1"), "greater than or equal to 0"),
        (("--claim-ahead", "2", "--fleet-concurrency", "4"), "fleet_max_concurrency"),
    ])
    def test_a_claim_ahead_the_worker_cannot_honour_exits_2_before_touching_a_database(
            self, options: tuple[str, ...], says: str):
        nowhere = "postgresql://nobody@/nowhere?host=/nonexistent"
        result = cli("worker", "--app", "zeroth_pg.demo:handle", "--deployment", "d", *options,
                     dsn=nowhere)
        assert result.returncode == 2
        assert "--claim-ahead" in result.stderr
        assert says in result.stderr

    def test_an_unreachable_database_exits_1_with_one_line(self):
        result = cli("runs", "list", dsn="postgresql://nobody@/nowhere?host=/nonexistent",
                     process=True)
        assert result.returncode == 1
        assert result.stderr.startswith("error:")
        assert "Traceback" not in result.stderr

    def test_parse_duration(self):
        assert parse_duration("7d") == timedelta(days=7)
        assert parse_duration("1d12h") == timedelta(days=1, hours=12)
        assert parse_duration("90m") == timedelta(minutes=90)
        assert parse_duration("1.5s") == timedelta(seconds=1.5)
        for bad in ("", "7", "d", "7x", "7d-1h"):
            with pytest.raises(typer.BadParameter):
                parse_duration(bad)


class TestMigrate:
    def test_sql_prints_the_install_script(self):
        result = cli("migrate", "sql", process=True)
        assert result.returncode == 0
        assert result.stdout == migrate.install_sql()

    def test_sql_from_a_revision_or_a_database_prints_the_upgrade_script(self,
                                                                        empty_database_dsn):
        result = cli("migrate", "sql", "--from", "0007")
        assert result.returncode == 0
        assert result.stdout == migrate.upgrade_sql("0007")
        migrate.upgrade(empty_database_dsn, "0005")
        result = cli("migrate", "sql", "--dsn", empty_database_dsn)
        assert result.returncode == 0
        assert result.stdout == migrate.upgrade_sql("0005")

    def test_sql_from_an_unknown_revision_is_refused(self):
        result = cli("migrate", "sql", "--from", "0042")
        assert result.returncode != 0
        assert "unknown revision" in result.stderr
        assert result.stdout == ""

    def test_verify_fails_until_migrate_up_brings_the_schema_to_head(self,
                                                                     empty_database_dsn):
        dsn = empty_database_dsn
        missing = cli("verify", "--json", dsn=dsn)
        assert missing.returncode == 3
        assert json.loads(missing.stdout)["state"] == "not_installed"
        migrate.upgrade(dsn, "0003")
        status = ok_json(cli("migrate", "status", "--json", dsn=dsn))
        assert status["state"] == "behind"
        assert status["current"] == "0003"
        assert status["pending"] == [p.stem for p in migrate.sql_files()][3:]
        assert cli("verify", dsn=dsn).returncode == 3
        up = ok_json(cli("migrate", "up", "--json", dsn=dsn))
        assert (up["from"], up["state"], up["pending"]) == ("0003", "current", [])
        assert up["current"] == up["head"] == migrate.head_revision()
        assert cli("verify", dsn=dsn).returncode == 0

    async def test_verify_warns_while_public_may_connect_and_still_exits_0(self, database_dsn):
        # The zeroth roles span the cluster: with PUBLIC's CONNECT a LOGIN member made for
        # another database of the cluster can use this one too (docs/security.md).
        warned = cli("verify", "--json", dsn=database_dsn)
        assert warned.returncode == 0, warned.stderr
        (warning,) = json.loads(warned.stdout)["warnings"]
        conn = await asyncpg.connect(database_dsn)
        try:
            name = await conn.fetchval("SELECT quote_ident(current_database())")
            assert f"REVOKE CONNECT ON DATABASE {name} FROM PUBLIC" in warning
            plain = cli("verify", dsn=database_dsn)
            assert plain.returncode == 0
            assert f"warning: PUBLIC may connect to database {name}" in plain.stderr
            assert f"GRANT CONNECT ON DATABASE {name} TO" in plain.stderr
            await conn.execute(f"REVOKE CONNECT ON DATABASE {name} FROM PUBLIC")
            quiet = cli("verify", "--json", dsn=database_dsn)
            assert quiet.returncode == 0, quiet.stderr
            assert json.loads(quiet.stdout)["warnings"] == []
            assert "warning" not in quiet.stderr
        finally:
            await conn.close()

    async def test_verify_fails_on_a_revision_this_package_does_not_know(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute("UPDATE zeroth.alembic_version SET version_num = '9999'")
        finally:
            await conn.close()
        result = cli("verify", "--json", dsn=database_dsn, process=True)
        assert result.returncode == 3
        assert json.loads(result.stdout)["state"] == "unknown"
        assert "newer than this package" in result.stderr


class TestEnqueue:
    async def test_single_run_with_every_option_and_an_idempotent_repeat(self, database_dsn):
        args = ("enqueue", "--deployment", "mail", "--payload", '{"to": "a@b"}', "--priority",
                "5", "--max-attempts", "7", "--idempotency-key", "k-1", "--run-after", "1h",
                "--metadata", '{"source": "cli"}', "--tenant", "acme", "--json")
        first = ok_json(cli(*args, dsn=database_dsn))
        again = ok_json(cli(*args, dsn=database_dsn))
        assert first["created"] is True
        assert first["status"] == "pending"
        assert again == {**first, "created": False}
        conn = await asyncpg.connect(database_dsn)
        try:
            row = await conn.fetchrow(
                """SELECT r.tenant_id, r.payload::text, r.priority, r.max_attempts,
                          r.metadata::text, r.run_after - clock_timestamp() AS delay
                     FROM zeroth.runs r WHERE r.run_id = $1""", UUID(first["run_id"]))
        finally:
            await conn.close()
        assert row["tenant_id"] == "acme"
        assert json.loads(row["payload"]) == {"to": "a@b"}
        assert (row["priority"], row["max_attempts"]) == (5, 7)
        assert json.loads(row["metadata"]) == {"source": "cli"}
        assert timedelta(minutes=55) < row["delay"] <= timedelta(hours=1)

    async def test_batch_reads_json_lines_and_applies_the_option_defaults(self, database_dsn):
        lines = ('{"payload": {"n": 1}}\n\n{"payload": {"n": 2}, "priority": 9}\n'
                 '{"payload": {"n": 3}, "idempotency_key": "same"}\n'
                 '{"payload": {"n": 4}, "idempotency_key": "same"}\n')
        result = cli("enqueue", "--deployment", "bulk", "--batch", "--priority", "3",
                     "--chunk-size", "2", "--json", dsn=database_dsn, stdin=lines,
                     process=True)
        assert result.returncode == 0, result.stderr
        out = [json.loads(line) for line in result.stdout.splitlines()]
        assert [r["created"] for r in out] == [True, True, True, False]
        assert out[2]["run_id"] == out[3]["run_id"]
        conn = await asyncpg.connect(database_dsn)
        try:
            rows = await conn.fetch("""SELECT (r.payload ->> 'n')::int AS n, r.priority
                                         FROM zeroth.runs r WHERE r.deployment_ref = 'bulk'
                                        ORDER BY 1""")
        finally:
            await conn.close()
        assert [(r["n"], r["priority"]) for r in rows] == [(1, 3), (2, 9), (3, 3)]

    async def test_a_malformed_batch_enqueues_nothing(self, database_dsn):
        bad_line = cli("enqueue", "--deployment", "bulk", "--batch", dsn=database_dsn,
                       stdin='{"payload": {}}\nnot json\n')
        assert bad_line.returncode == 2
        assert "line 2" in bad_line.stderr
        unknown_key = cli("enqueue", "--deployment", "bulk", "--batch", dsn=database_dsn,
                          stdin='{"payload": {}}\n{"colour": "red"}\n')
        assert unknown_key.returncode == 2
        conn = await asyncpg.connect(database_dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0
        finally:
            await conn.close()


class TestRuns:
    async def test_list_filters_and_show_prints_the_checkpoints_and_attempts(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await db_now(conn)
            done = await make_run(conn, "completed", deployment_ref="a", now=now)
            failed = await make_run(conn, "failed", deployment_ref="a", now=now)
            other = await make_run(conn, "completed", deployment_ref="b", now=now)
            running = await make_run(conn, "running", deployment_ref="a", tenant_id="acme",
                                     workspace_id="ws", now=now)
            for step in (1, 2):
                assert await conn.fetchval(
                    """SELECT zeroth.save_checkpoint(run_id => $1, worker_id => $2,
                           generation => $3, data => $4::text::jsonb, tenant_id => 'acme',
                           workspace_id => 'ws')""",
                    running.run_id, running.worker_id, running.generation,
                    json.dumps({"step": step}))
        finally:
            await conn.close()

        def ids(*args: str) -> set[str]:
            return {row["run_id"] for row in ok_json(cli("runs", "list", "--json", *args,
                                                         dsn=database_dsn))}

        newest = ids("--limit", "3")
        assert len(newest) == 3
        assert newest < {str(r.run_id) for r in (done, failed, other, running)}
        assert ids("--deployment", "a", "--status", "completed") == {str(done.run_id)}
        assert ids("--status", "failed", "--status", "running") == {str(failed.run_id),
                                                                      str(running.run_id)}
        assert ids("--tenant", "acme") == {str(running.run_id)}

        shown = ok_json(cli("runs", "show", str(running.run_id), "--json", dsn=database_dsn))
        assert (shown["tenant_id"], shown["workspace_id"], shown["status"]) == (
            "acme", "ws", "running")
        assert [c["data"] for c in shown["checkpoints"]] == [{"step": 1}, {"step": 2}]
        table = cli("runs", "show", str(running.run_id), dsn=database_dsn)
        assert table.returncode == 0
        assert "2 checkpoint(s)" in table.stdout
        assert [(a["attempt"], a["lease_generation"], a["outcome"])
                for a in shown["attempt_history"]] == [(1, 1, None)]
        assert "1 attempt(s)" in table.stdout
        assert "(open)" in table.stdout
        finished = ok_json(cli("runs", "show", str(done.run_id), "--json", dsn=database_dsn))
        assert [a["outcome"] for a in finished["attempt_history"]] == ["completed"]

        other_scope = cli("runs", "show", str(running.run_id), "--tenant", "default",
                          dsn=database_dsn)
        assert other_scope.returncode == 4
        assert other_scope.stderr.startswith("error: no run")

    async def test_cancel_then_redrive_in_the_run_s_own_scope(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            run = await make_run(conn, "pending", tenant_id="acme", now=await db_now(conn))
            run_id = str(run.run_id)
            cancelled = ok_json(cli("runs", "cancel", run_id, "--json", dsn=database_dsn))
            assert cancelled == {"run_id": run_id, "outcome": "cancelled"}
            again = cli("runs", "cancel", run_id, dsn=database_dsn)
            assert again.returncode == 1
            assert "already cancelled" in again.stderr
            redriven = ok_json(cli("runs", "redrive", run_id, "--json", dsn=database_dsn))
            assert redriven == {"run_id": run_id, "redriven": True}
            assert await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                       run.run_id) == "pending"
            not_redrivable = cli("runs", "redrive", run_id, dsn=database_dsn)
            assert not_redrivable.returncode == 1
            assert not_redrivable.stderr.startswith("error:")
        finally:
            await conn.close()
        unknown = "00000000-0000-0000-0000-000000000000"
        assert cli("runs", "cancel", unknown, dsn=database_dsn, process=True).returncode == 4


async def _dead_letter(conn: asyncpg.Connection, deployment: str, now: datetime) -> None:
    run = await make_run(conn, "running", deployment_ref=deployment, max_attempts=1, now=now)
    outcome = await conn.fetchval(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => '{}', retryable => true, now_override => $4)""",
        run.run_id, run.worker_id, run.generation, now)
    assert outcome == "dead_lettered"


COUNT_KEYS = ("pending", "due", "scheduled", "running", "live_leases", "expired_leases",
              "waiting", "failed", "dead_letters")


async def _limited_fleet(conn: asyncpg.Connection) -> None:
    """Runs of two deployments in four scopes, and zeroth.scope_limits rows: one for a scope
    with runs, two paused scopes without any run (one of them of a deployment with no run)."""
    now = await db_now(conn)
    await make_run(conn, "pending", deployment_ref="mail", tenant_id="acme", now=now)
    await make_run(conn, "pending", deployment_ref="mail", tenant_id="acme", now=now)
    await make_run(conn, "running", deployment_ref="mail", tenant_id="acme", now=now)
    await make_run(conn, "pending", deployment_ref="mail", tenant_id="acme",
                   workspace_id="eu", now=now)
    await make_run(conn, "pending", deployment_ref="mail", tenant_id="globex", now=now)
    await conn.execute(
        """INSERT INTO zeroth.scope_limits (tenant_id, workspace_id, deployment_ref,
                                            max_concurrency, weight, paused, note)
           VALUES ('acme', NULL, 'mail', 4, 3, false, 'contract'),
                  ('initech', NULL, 'mail', 2, 1, true, 'unpaid'),
                  ('globex', NULL, 'resize', NULL, 1, true, NULL)""")


class TestStatus:
    async def test_counts_per_deployment_and_tenant_from_the_operator_views(self,
                                                                             database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await db_now(conn)
            await make_run(conn, "pending", deployment_ref="a", now=now)
            await make_run(conn, "pending", deployment_ref="a", now=now,
                           run_after=now + timedelta(hours=1))
            await make_run(conn, "running", deployment_ref="a", now=now)
            await make_run(conn, "running", deployment_ref="a", now=now - timedelta(hours=1))
            await _dead_letter(conn, "a", now)
            await make_run(conn, "pending", deployment_ref="a", tenant_id="acme", now=now)
            await make_run(conn, "completed", deployment_ref="b", now=now)
        finally:
            await conn.close()
        status = ok_json(cli("status", "--json", dsn=database_dsn))
        scopes = {(s["tenant_id"], s["deployment_ref"]): s for s in status["scopes"]}
        assert set(scopes) == {("default", "a"), ("acme", "a")}
        assert {k: v for k, v in scopes[("default", "a")].items() if k != "workspace_id"} == {
            "tenant_id": "default", "deployment_ref": "a", "pending": 2, "due": 1,
            "scheduled": 1, "running": 2, "live_leases": 1, "expired_leases": 1, "waiting": 0,
            "failed": 0, "dead_letters": 1,
            "max_concurrency": None, "weight": None, "paused": None,
            "rate_limit": None}  # no scope_limits row
        assert scopes[("acme", "a")]["pending"] == 1
        only_acme = cli("status", "--tenant", "acme", dsn=database_dsn)
        assert only_acme.returncode == 0, only_acme.stderr
        assert "acme" in only_acme.stdout
        assert "default" not in only_acme.stdout

    async def test_waiting_runs_and_failures_without_a_dead_letter_are_counted(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await db_now(conn)
            await make_run(conn, "waiting", deployment_ref="approve", now=now)
            await make_run(conn, "waiting", deployment_ref="approve", now=now)
            failed = await make_run(conn, "running", deployment_ref="approve", now=now)
            await conn.execute(
                """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                       error => '{"type": "NonRetryableError"}', retryable => false,
                       now_override => $4)""", failed.run_id, failed.worker_id,
                failed.generation, now)
            await _dead_letter(conn, "approve", now)
        finally:
            await conn.close()
        status = ok_json(cli("status", "--json", dsn=database_dsn))
        [scope] = status["scopes"]
        assert (scope["waiting"], scope["failed"], scope["dead_letters"]) == (2, 1, 1)

    async def test_each_scope_shows_its_limits_and_a_paused_empty_scope_is_shown(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _limited_fleet(conn)
        finally:
            await conn.close()
        status = ok_json(cli("status", "--json", dsn=database_dsn))
        assert set(status) == {"at", "scopes", "pinned"}
        scopes = {(s["tenant_id"], s["workspace_id"], s["deployment_ref"]): s
                  for s in status["scopes"]}
        assert set(scopes) == {("acme", None, "mail"), ("acme", "eu", "mail"),
                               ("globex", None, "mail"), ("globex", None, "resize"),
                               ("initech", None, "mail")}
        limits = {k: (s["max_concurrency"], s["weight"], s["paused"]) for k, s in scopes.items()}
        assert limits == {("acme", None, "mail"): (4, 3, False),
                          ("acme", "eu", "mail"): (None, None, None),  # no limits row
                          ("globex", None, "mail"): (None, None, None),
                          ("globex", None, "resize"): (None, 1, True),
                          ("initech", None, "mail"): (2, 1, True)}
        # The paused scope with nothing queued, nothing leased and no dead letter is a row too.
        assert {k: v for k, v in scopes[("initech", None, "mail")].items()
                if k in COUNT_KEYS} == dict.fromkeys(COUNT_KEYS, 0)
        assert (scopes[("acme", None, "mail")]["pending"],
                scopes[("acme", "eu", "mail")]["pending"]) == (2, 1)
        table = cli("status", dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        header = next(line for line in table.stdout.splitlines() if "deployment" in line)
        assert header.split() == ["tenant", "workspace", "deployment", "pending", "due",
                                  "scheduled", "running", "leased", "expired", "waiting",
                                  "failed", "dead", "limit", "weight", "paused"]
        rows = {tuple(line.split()[:3]): line.split() for line in table.stdout.splitlines()
                if line.split()[:1] == ["initech"]}
        assert rows == {("initech", "mail", "0"): ["initech", "mail", *["0"] * 9, "2", "1",
                                                    "yes"]}
        # The scope limits rows match the filters like the runs.
        assert all(s["rate_limit"] is None for s in scopes.values())
        only_mail = ok_json(cli("status", "--json", "--tenant", "initech", dsn=database_dsn))
        assert [s["deployment_ref"] for s in only_mail["scopes"]] == ["mail"]
        assert ok_json(cli("status", "--json", "--tenant", "initech", "--deployment", "resize",
                           dsn=database_dsn))["scopes"] == []

    async def test_by_deployment_sums_every_scope(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _limited_fleet(conn)
        finally:
            await conn.close()
        status = ok_json(cli("status", "--by", "deployment", "--json", dsn=database_dsn))
        assert set(status) == {"at", "deployments", "pinned"}
        assert status["deployments"] == [
            {"deployment_ref": "mail", "scopes": 4, "pending": 4, "due": 4,
             "scheduled": 0, "running": 1, "live_leases": 1, "expired_leases": 0, "waiting": 0,
             "failed": 0, "dead_letters": 0, "paused_scopes": 1},
            {"deployment_ref": "resize", "scopes": 1, "pending": 0, "due": 0,
             "scheduled": 0, "running": 0, "live_leases": 0, "expired_leases": 0, "waiting": 0,
             "failed": 0, "dead_letters": 0, "paused_scopes": 1}]
        only_acme = ok_json(cli("status", "--by", "deployment", "--tenant", "acme", "--json",
                                dsn=database_dsn))
        assert [(d["deployment_ref"], d["scopes"], d["pending"])
                for d in only_acme["deployments"]] == [("mail", 2, 3)]
        table = cli("status", "--by", "deployment", dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        lines = [line.split() for line in table.stdout.splitlines()]
        assert ["deployment", "scopes", "pending", "due", "scheduled", "running", "leased",
                "expired", "waiting", "failed", "dead", "paused"] in lines
        assert ["mail", "4", "4", "4", "0", "1", "1", "0", "0", "0", "0", "1"] in lines

    async def test_a_reader_sees_its_own_tenant_and_its_limits(self, database_dsn,
                                                                pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _limited_fleet(conn)
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                # The tenant a reader names (here for every session of its role).
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'initech'")
                reader = dsn_as(database_dsn, name, password)
                status = ok_json(cli("status", "--json", dsn=reader))
                by_deployment = ok_json(cli("status", "--json", "--by", "deployment",
                                            dsn=reader))
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                acme = ok_json(cli("status", "--json", dsn=reader))
        finally:
            await conn.close()
        assert [(s["tenant_id"], s["deployment_ref"], s["max_concurrency"], s["paused"])
                for s in status["scopes"]] == [("initech", "mail", 2, True)]
        assert [(d["deployment_ref"], d["scopes"], d["paused_scopes"])
                for d in by_deployment["deployments"]] == [("mail", 1, 1)]
        assert [(s["workspace_id"], s["pending"], s["live_leases"], s["weight"])
                for s in acme["scopes"]] == [(None, 2, 1, 3), ("eu", 1, 0, None)]

    def test_watch_refreshes_until_its_count(self, database_dsn):
        result = cli("status", "--watch", "--interval", "0.1", "--count", "3", "--json",
                     dsn=database_dsn, process=True)
        assert result.returncode == 0, result.stderr
        samples = [json.loads(line) for line in result.stdout.splitlines()]
        assert len(samples) == 3
        assert samples[0]["at"] < samples[1]["at"] < samples[2]["at"]


class TestPrune:
    async def test_deletes_only_finished_runs_older_than_the_cutoff(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await db_now(conn)
            old, recent = now - timedelta(days=10), now - timedelta(days=1)
            for status in ("failed", "cancelled"):
                await make_run(conn, status, now=old)
            checkpointed = await make_run(conn, "running", now=old)
            fence = (checkpointed.run_id, checkpointed.worker_id, checkpointed.generation, old)
            assert await conn.fetchval(
                """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                       generation => $3,
                       data => '{}', now_override => $4)""", *fence)
            assert await conn.fetchval(
                """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                       output => '{}', now_override => $4)""", *fence)
            kept = [await make_run(conn, "completed", now=recent),
                    await make_run(conn, "pending", now=old),
                    await make_run(conn, "running", now=old),
                    await make_run(conn, "waiting", now=old),
                    await make_run(conn, "completed", tenant_id="acme", now=old)]
            result = ok_json(cli("prune", "--older-than", "7d", "--batch-size", "2",
                                 "--tenant", "default", "--json", dsn=database_dsn))
            assert result["deleted"] == 3
            assert result["batches"] == 3  # 2 + 1 + the empty batch that ends the loop
            left = {r["run_id"] for r in await conn.fetch("SELECT run_id FROM zeroth.runs")}
            assert left == {lease.run_id for lease in kept}
            assert await conn.fetchval("SELECT count(*) FROM zeroth.checkpoints") == 0
            everyone = cli("prune", "--older-than", "7d", dsn=database_dsn, process=True)
            assert everyone.returncode == 0, everyone.stderr
            assert "deleted 1 finished run(s)" in everyone.stdout  # acme's old completed run
        finally:
            await conn.close()

    async def test_prunes_the_registrys_old_changes_keeping_each_deployments_latest(
            self, database_dsn):
        # issue 31: zeroth.deployment_changes (the registry's audit) is pruned with the runs.
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await db_now(conn)
            for attempts, when in ((2, now - timedelta(days=10)), (3, now - timedelta(days=9)),
                                   (4, now - timedelta(days=8))):
                await conn.execute(
                    "SELECT zeroth_test.set_deployment_defaults(deployment_ref => 'mail', "
                    "max_attempts => $1, now_override => $2)", attempts, when)
            await conn.execute(
                "SELECT zeroth_test.set_deployment_defaults(deployment_ref => 'sms', "
                "max_attempts => 2, now_override => $1)", now - timedelta(days=10))
            scoped = ok_json(cli("prune", "--older-than", "7d", "--tenant", "default", "--json",
                                 dsn=database_dsn))
            assert scoped["deleted"] == 0  # the audit is global: a scope's prune leaves it
            everyone = cli("prune", "--older-than", "7d", dsn=database_dsn)
            assert everyone.returncode == 0, everyone.stderr
            assert "deleted 2 finished run(s), event(s) and deployment change(s)" in (
                everyone.stdout)
            left = await conn.fetch("SELECT deployment_ref, version FROM "
                                    "zeroth.deployment_changes ORDER BY deployment_ref")
            assert [tuple(r) for r in left] == [("mail", 3), ("sms", 1)]
        finally:
            await conn.close()


class TestWorker:
    async def test_worker_command_completes_runs_and_drains_on_sigterm(self, database_dsn):
        pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "zeroth_pg.cli", "worker", "--app", "zeroth_pg.demo:handle",
            "--deployment", "cli-worker", "--poll-interval", "0.2", "--log-level", "INFO",
            cwd=REPO, env={**env, "ZEROTH_PG_DSN": database_dsn},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE)
        try:
            queued = await LeaseManager(pool).enqueue_run("cli-worker", {"steps": 2})
            deadline = time.monotonic() + DEADLINE
            status = None
            while status != "completed" and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                status = await pool.fetchval(
                    "SELECT status::text FROM zeroth.runs WHERE run_id = $1", queued.run_id)
            assert status == "completed"
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), timeout=DEADLINE)
            assert proc.stderr is not None
            log = (await proc.stderr.read()).decode()
            assert code == 0, log
            assert "stopped" in log
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await pool.close()

    async def test_scope_metrics_option_counts_runs_per_scope_on_the_metrics_port(
            self, database_dsn):
        with socket.socket() as probe:  # a free port for /metrics
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "zeroth_pg.cli", "worker", "--app", "zeroth_pg.demo:handle",
            "--deployment", "cli-scoped", "--tenant", "acme", "--workspace", "eu",
            "--poll-interval", "0.2", "--scope-metrics", "--metrics-port", str(port),
            cwd=REPO, env={**env, "ZEROTH_PG_DSN": database_dsn},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
        labels = 'deployment="cli-scoped",tenant="acme",workspace="eu"'
        wanted = {f"zeroth_scope_runs_started_total{{{labels}}} 3.0",
                  f"zeroth_scope_runs_completed_total{{{labels}}} 2.0",
                  f"zeroth_scope_runs_failed_total{{{labels}}} 1.0"}

        def scrape() -> set[str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as page:
                    return set(page.read().decode().splitlines())
            except OSError:
                return set()  # not serving yet

        try:
            lm = LeaseManager(pool)
            for payload, attempts in (({"steps": 1}, 3), ({"steps": 1}, 3),
                                      ({"steps": 1, "always_fail": True}, 1)):
                await lm.enqueue_run("cli-scoped", payload, tenant_id="acme",
                                     workspace_id="eu", max_attempts=attempts)
            deadline = time.monotonic() + DEADLINE
            lines = set()
            while not wanted <= lines and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                lines = await asyncio.to_thread(scrape)
            assert wanted <= lines
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=DEADLINE)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await pool.close()


class TestDemo:
    def test_demo_with_500_runs_ends_with_the_expected_summary(self, database_dsn):
        result = cli("demo", "--runs", "500", "--json", dsn=database_dsn, timeout=300,
                     process=True)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        payloads = [item["payload"] for item in demo._payloads(500, random.Random(7))]
        always_fail = sum(1 for p in payloads if p.get("always_fail"))
        assert summary["runs"] == 500
        assert summary["open"] == 0
        assert summary["failed"] == summary["dead_lettered"] == always_fail
        assert summary["completed"] == 500 - always_fail
        # Every transient failure is retried until it passes; dead letters used all 3 attempts.
        # A run recovered from the killed worker counts one more attempt (the one that died):
        # at most the killed worker's leases, twice its 16 slots.
        handler_retries = sum(p.get("fail_attempts", 0) for p in payloads) + 2 * always_fail
        assert handler_retries <= summary["retries"] <= handler_retries + 2 * 16
        assert summary["killed_worker"] is True
        assert summary["recovered"] >= 1  # the killed worker's runs, resumed elsewhere
        assert summary["throughput"] > 0
        assert "SIGKILLed demo-worker-0" in result.stderr

    def test_summary_table_rows(self):
        summary = demo.DemoSummary(
            deployment="demo-x", runs=2000, completed=1985, failed=15, dead_lettered=15,
            retries=120, recovered=17, steps_saved=20, open=0, wall_seconds=10.0,
            killed_worker=True)
        console = Console(record=True, width=100)
        console.print(summary.table())
        text = console.export_text()
        for row in ("runs  ", "2,000", "completed", "1,985", "failed (dead-lettered)", "15 (15)",
                    "retries", "recovered after the kill", "17 (checkpointed steps not redone: 20)",
                    "wall time", "10.0 s", "throughput", "200 runs/s"):
            assert row in text


async def test_status_shows_the_rate_limit_a_scope_draws_from(database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        await conn.execute("SELECT zeroth.set_rate_limit(name => 'llm', max_starts => 600, "
                           "period_seconds => 60)")
        await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, "
                           "rate_limit) VALUES ('acme', 'summarise', 'llm')")
    finally:
        await conn.close()
    status = ok_json(cli("status", "--json", dsn=database_dsn))
    assert [(s["deployment_ref"], s["rate_limit"]) for s in status["scopes"]] == [
        ("summarise", "llm:600/60s")]
    table = cli("status", dsn=database_dsn)
    assert table.returncode == 0, table.stderr
    header = next(line for line in table.stdout.splitlines() if "deployment" in line)
    assert header.split()[-1] == "rate"
    assert "llm:600/60s" in table.stdout
