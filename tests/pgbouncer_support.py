"""A PgBouncer (Debian ``pgbouncer``) on a loopback port, for the tests of clients behind one:
transaction pooling (tests/security/test_pgbouncer.py) and one that reports a stale role
(tests/client/test_writable_server.py, tests/failover/test_stale_pooler.py). Skips, printing
why, only when pgbouncer is not installed (.ci/run installs it; with ZEROTH_PG_REQUIRE_HA=1, as
CI sets it, that fails instead)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

__all__ = ["bouncer", "bouncer_process", "pgbouncer_executable"]


def pgbouncer_executable() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None)
    if found is None:
        reason = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
        if os.environ.get("ZEROTH_PG_REQUIRE_HA") == "1":
            # CI (as root) installs it: the stale-role failover tests must run there
            pytest.fail(f"ZEROTH_PG_REQUIRE_HA=1 but {reason}")
        print(f"\nskipped: {reason}")
        pytest.skip(reason)
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def bouncer(databases: str, *, user: str, socket_dir: str | None = None,
            pool_mode: str = "session", pool_size: int = 8,
            max_client_conn: int = 100) -> Iterator[int]:
    """A PgBouncer on a loopback port (session pooling unless ``pool_mode`` says otherwise),
    ``databases`` its [databases] section, ``user`` let in without a password; yields its port
    once it answers. As root it runs as the owner of ``socket_dir`` (the server's socket
    directory, which it must reach) or as nobody (PgBouncer refuses root)."""
    with bouncer_process(databases, user=user, socket_dir=socket_dir, pool_mode=pool_mode,
                         pool_size=pool_size, max_client_conn=max_client_conn) as (port, _):
        yield port


@contextlib.contextmanager
def bouncer_process(databases: str, *, user: str, socket_dir: str | None = None,
                    pool_mode: str = "session", pool_size: int = 8,
                    max_client_conn: int = 100) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """:func:`bouncer`, yielding its process too (to freeze it with SIGSTOP: a hung host as its
    clients see it). A stopped PgBouncer is continued before it is terminated."""
    executable = pgbouncer_executable()
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="zeroth-pgbouncer-", dir="/dev/shm"
                                    if Path("/dev/shm").is_dir() else None))
    workdir.chmod(0o755)
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(f"""[databases]
{databases}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {workdir}/users.txt
admin_users = {user}
pool_mode = {pool_mode}
default_pool_size = {pool_size}
max_client_conn = {max_client_conn}
server_login_retry = 1
ignore_startup_parameters = extra_float_digits
""")
    for path in workdir.iterdir():
        path.chmod(0o644)
    run_as: list[str] = []
    if os.geteuid() == 0:
        uid = os.stat(socket_dir).st_uid if socket_dir else pwd.getpwnam("nobody").pw_uid
        run_as = ["-u", pwd.getpwuid(uid).pw_name]
    log_path = workdir / "pgbouncer.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([executable, *run_as, str(workdir / "pgbouncer.ini")],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/pgbouncer",
                                     connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SHOW VERSION")
                break
            except psycopg.OperationalError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{log_path.read_text()}") \
                        from exc
                time.sleep(0.05)
        yield port, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)  # a SIGTERM waits while it is stopped
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
