"""The readers docs/scaling.md takes off the primary ("Take the readers off the primary": the
operator views, the dashboard, ``zeroth_reader`` queries work on a hot standby) keep working on
standbys named by a DSN of several hosts.

libpq and asyncpg take a DSN of several hosts without ``target_session_attrs`` as ``any``: the
first host that answers. zeroth_pg takes it as ``read-write`` for what writes (a worker, an App:
zeroth_pg/_connect.py), but a dashboard without actions, the fleet metrics exporter and the
read-only commands (``runs list``, ``runs show``, ``status``) only read:
demanding a writable server there turns a working read-replica setup into an error page.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from failover_support import DATABASE
from helpers import dashboard
from replication import ReplicatedPair

from zeroth_pg import fleet_metrics
from zeroth_pg.web import create_app

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]


def _replicas_dsn(pair: ReplicatedPair) -> str:
    # Two replica entries, no target_session_attrs: what an operator writes for a dashboard on
    # the read replicas (here both entries name the one standby of the pair).
    port = pair.standby.port
    return f"postgresql://postgres@127.0.0.1:{port},127.0.0.1:{port}/{DATABASE}"


def test_a_dashboard_without_actions_reads_from_standbys_named_by_several_hosts(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _dsn = sync_pair
    with dashboard(create_app(_replicas_dsn(pair))) as client:
        for path in ("/", "/runs", "/metrics"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text[:500])


def test_the_fleet_metrics_exporter_reads_from_standbys_named_by_several_hosts(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _dsn = sync_pair

    async def scraped() -> bytes:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(fleet_metrics.serve(
            _replicas_dsn(pair), port=0, on_ready=ready.set_result))
        try:
            await asyncio.wait({ready, server}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():
                server.result()  # it stopped before it listened: its error
            port = ready.result()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close"
                         b"\r\n\r\n")
            await writer.drain()
            answer = await reader.read()
            writer.close()
            return answer
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server

    answer = asyncio.run(scraped())
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b"zeroth_" in answer


def test_the_read_only_cli_commands_read_from_standbys_named_by_several_hosts(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pair, _dsn = sync_pair
    env = {**os.environ, "ZEROTH_PG_DSN": _replicas_dsn(pair)}
    for args in (["runs", "list", "--json"], ["status", "--json"]):
        done = subprocess.run([sys.executable, "-m", "zeroth_pg.cli", *args], env=env,
                              capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
