"""The ``zeroth-pg`` commands that connect through asyncpg — enqueue, status, runs, worker, web —
take the documented libpq key=value DSN naming several servers (``host=H,H port=DEAD,P …
target_session_attrs=read-write``, the first server down), as migrate and verify (psycopg) do.
Real processes against the test server (ZEROTH_PG_DSN)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import asyncpg
from dsn_forms import keyword_multi_host
from test_cli import DEADLINE, REPO, cli, ok_json
from test_web_cli import free_port, get, printed_token, start, stop, wait_for_line

from zeroth_pg.client import LeaseManager


async def test_enqueue_status_and_runs_list_reach_the_server_after_the_dead_host(database_dsn):
    dsn = keyword_multi_host(database_dsn)
    queued = ok_json(cli("enqueue", "--deployment", "kv-dsn", "--payload", '{"n": 1}', "--json",
                         dsn=dsn, process=True))
    assert queued["created"] is True
    status = ok_json(cli("status", "--json", dsn=dsn))
    assert [s["pending"] for s in status["scopes"] if s["deployment_ref"] == "kv-dsn"] == [1]
    listed = ok_json(cli("runs", "list", "--deployment", "kv-dsn", "--json", dsn=dsn))
    assert [row["run_id"] for row in listed] == [queued["run_id"]]


async def test_a_worker_process_listens_and_completes_runs_through_it(database_dsn):
    pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "zeroth_pg.cli", "worker", "--app", "zeroth_pg.demo:handle",
        "--deployment", "kv-dsn-worker", "--poll-interval", "0.2", "--worker-id", "kv-dsn",
        cwd=REPO, env={**env, "ZEROTH_PG_DSN": keyword_multi_host(database_dsn)},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        queued = await LeaseManager(pool).enqueue_run("kv-dsn-worker", {"steps": 1})
        deadline = time.monotonic() + DEADLINE
        status = listening = None
        while (status != "completed" or not listening) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            status = await pool.fetchval(
                "SELECT status::text FROM zeroth.runs WHERE run_id = $1", queued.run_id)
            listening = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'zeroth-listener:kv-dsn'")
        assert status == "completed"
        assert listening == 1  # the LISTEN connection too, not only the pool
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), timeout=DEADLINE)
        assert proc.stderr is not None
        log = (await proc.stderr.read()).decode()
        assert code == 0, log
        assert "LISTEN connection failed" not in log
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await pool.close()


async def test_the_dashboard_process_serves_through_it(database_dsn, tmp_path):
    conn = await asyncpg.connect(database_dsn)
    try:
        await LeaseManager(conn).enqueue_run("kv-dsn-web", {})  # type: ignore[arg-type]
    finally:
        await conn.close()
    port = free_port()
    proc = start(["web", "--port", str(port)], keyword_multi_host(database_dsn), tmp_path)
    try:
        line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
        status, body = get(f"http://127.0.0.1:{port}/", printed_token(line))
    finally:
        stop(proc)
    assert status == 200, (tmp_path / "err").read_text()
    assert "kv-dsn-web" in body
