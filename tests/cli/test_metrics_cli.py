"""``zeroth-pg metrics``: the standalone exporter of the fleet's database gauges, as a
subprocess on a free port against the test database; what it serves, what it refuses, and its
stop on SIGTERM (exit 0)."""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path

import asyncpg
from fleet_states import check_scrape, due_age, seed
from test_web_cli import free_port, get, raw, start, stop, wait_for_line


async def test_the_exporter_serves_the_fleet_gauges_and_stops_on_sigterm(database_dsn: str,
                                                                         tmp_path: Path):
    dep = f"fleet-{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(database_dsn)
    port = free_port()
    proc = start(["metrics", "--port", str(port)], database_dsn, tmp_path)
    try:
        run_after = await seed(conn, dep)
        wait_for_line(proc, tmp_path / "out", f"http://127.0.0.1:{port}/metrics")
        before = await due_age(conn, run_after)
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        after = await due_age(conn, run_after)
        assert status == 200, text
        check_scrape(text, dep, age_before=before, age_after=after)

        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
        code, _, body = raw(port, "POST", "/metrics", {"Host": "127.0.0.1"}, form="x=1")
        assert code == 405
        assert "zeroth_fleet" not in body
        # A request whose head never ends within the bound gets no answer, and the exporter
        # goes on serving.
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 20_000 + b"\r\n\r\n")
            assert s.recv(100) == b""
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        code = stop(proc)
        await conn.close()
    assert code == 0, (tmp_path / "err").read_text()
    assert "stopped" in (tmp_path / "err").read_text()


def test_the_exporter_without_a_readable_overview_fails_the_scrape(database_dsn: str,
                                                                   tmp_path: Path):
    # The server's own database has no zeroth schema: every scrape is a 500 (Prometheus's `up`
    # is 0 for it), the process serves on and says why on stderr.
    bare = re.sub(r"/test_[0-9a-f]+", "/postgres", database_dsn, count=1)
    assert bare != database_dsn
    port = free_port()
    proc = start(["metrics", "--port", str(port), "--dsn", bare], database_dsn, tmp_path)
    try:
        wait_for_line(proc, tmp_path / "out", f":{port}/metrics")
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        again = get(f"http://127.0.0.1:{port}/metrics")[0]
    finally:
        code = stop(proc)
    assert (status, again) == (500, 500)
    assert "zeroth_fleet" not in body
    assert "UndefinedTableError" in (tmp_path / "err").read_text()
    assert code == 0
