"""README.md read top to bottom in one shell: every block runs as written, in the order a reader
meets it, against one database that the blocks before it left dirty (the demo's dead letters
included), from a folder of the reader's own — and every block ends.

The per-example tests (test_readme_example.py) give each example a fresh database; this one is
the reader's path, where the App example once waited for every run in the table and never
returned, and `zeroth-pg worker --app mymodule:app` typed next to mymodule.py could not import
it. The reader runs twice: on the session's server (PostgreSQL 18, the schema already there) and
on Debian's PostgreSQL 15 with initdb's settings, where they install the schema themselves with
`zeroth-pg migrate up --dsn`, as the README tells someone with a server of their own.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
from stock_postgres import stock_postgresql_15

README = Path(__file__).resolve().parents[2] / "README.md"
#: Every block gets this long; a block that has not ended by then is the defect this guards.
BLOCK_DEADLINE = 180


def _blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of README.md, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README.read_text(), re.S | re.M)


def _reader_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    env["ZEROTH_PG_DSN"] = dsn
    return env


def _console_script() -> str:
    """The installed `zeroth-pg` (a console script: its sys.path does not hold the cwd)."""
    script = Path(sys.executable).parent / "zeroth-pg"
    assert script.exists(), f"zeroth-pg is not installed beside {sys.executable}"
    return str(script)


def _python(code: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=BLOCK_DEADLINE)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def _wait_for_status(dsn: str, run_id: str, wanted: str, worker: subprocess.Popen[str]) -> None:
    async def status() -> str | None:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchval(  # type: ignore[no-any-return]
                "SELECT status::text FROM zeroth.runs WHERE run_id = $1::uuid", run_id)
        finally:
            await conn.close()

    import asyncio

    deadline = time.monotonic() + BLOCK_DEADLINE
    while (seen := asyncio.run(status())) != wanted:
        assert time.monotonic() < deadline, f"run {run_id} is {seen}, never {wanted}"
        assert worker.poll() is None, f"the worker exited: {worker.communicate()[1][-4000:]}"
        time.sleep(0.1)


def test_the_readme_runs_top_to_bottom_in_one_folder_on_one_dirty_database(
        database_dsn: str, tmp_path: Path) -> None:
    _read_top_to_bottom(database_dsn, tmp_path)


def test_the_readme_runs_top_to_bottom_on_a_stock_postgresql_15(tmp_path: Path) -> None:
    """The same reader on Debian's PostgreSQL 15 as it comes (initdb's settings: 100
    connections, fsync on, autovacuum at its defaults), into a database of their own that they
    install the schema into as the README says, with `zeroth-pg migrate up --dsn`."""
    with stock_postgresql_15() as server:
        dsn = server.database("reader")
        install = subprocess.run([_console_script(), "migrate", "up", "--dsn", dsn],
                                 cwd=tmp_path, env=_reader_env(dsn), capture_output=True,
                                 text=True, timeout=BLOCK_DEADLINE)
        assert install.returncode == 0, install.stderr[-4000:]
        _read_top_to_bottom(dsn, tmp_path)


def _read_top_to_bottom(database_dsn: str, tmp_path: Path) -> None:
    env = _reader_env(database_dsn)
    blocks = _blocks()
    python_blocks = [code for lang, code in blocks if lang == "python"]
    shell_blocks = [code for lang, code in blocks if lang == "sh"]

    # Quick start, as written but for the install (done) and a smaller demo (its leftovers are
    # the point: dead letters of other deployments stay in the table).
    quick_start = shell_blocks[0]
    assert "python -m zeroth_pg.demo" in quick_start
    demo = subprocess.run([sys.executable, "-m", "zeroth_pg.demo"], cwd=tmp_path,
                          env={**env, "ZEROTH_PG_DEMO_RUNS": "300"}, capture_output=True,
                          text=True, timeout=BLOCK_DEADLINE)
    assert demo.returncode == 0, demo.stderr[-4000:]

    # The application: mymodule.py, then the script beside it, which prints its own two runs.
    module, script, worker_example = python_blocks[:3]
    assert "asyncio.run" not in module, "mymodule.py must be importable by a worker process"
    (tmp_path / "mymodule.py").write_text(module)
    (tmp_path / "try_it.py").write_text(script)
    printed = _python("import runpy; runpy.run_path('try_it.py', run_name='__main__')",
                      tmp_path, env)
    assert sorted(printed.splitlines()) == [
        'resize completed {"path": "cat.png", "width": 640}',
        'send-email completed {"sent_to": "ada@example.com"}',
    ]

    # The production command, typed in the module's folder.
    production = next(code for code in shell_blocks if "zeroth-pg worker" in code).strip()
    assert production == "zeroth-pg worker --app mymodule:app"
    worker = subprocess.Popen([_console_script(), "worker", "--app", "mymodule:app",
                               "--poll-interval", "0.1"],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        enqueued = subprocess.run(
            [_console_script(), "enqueue", "--deployment", "resize", "--payload",
             '{"path": "dog.png", "width": 320}', "--json"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_DEADLINE)
        assert enqueued.returncode == 0, enqueued.stderr
        run_id = re.search(r'"run_id":\s*"([0-9a-f-]{36})"', enqueued.stdout)
        assert run_id, enqueued.stdout
        _wait_for_status(database_dsn, run_id.group(1), "completed", worker)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.communicate(timeout=BLOCK_DEADLINE)
    assert worker.returncode == 0

    # The worker in 15 lines, on the same table.
    _python(worker_example, tmp_path, env)
