"""Traces out of ``zeroth-pg worker`` with no code (issue 31): the standard ``OTEL_*`` variables
(or ``--otel``) set up the OpenTelemetry SDK of the worker process, whose spans then leave it by
OTLP over HTTP — here to a tiny collector the test runs on 127.0.0.1, no network. Asked for on
the command line and impossible (no SDK, an unknown exporter), the worker says why and exits 2.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import asyncpg
import pytest

from zeroth_pg import tracing
from zeroth_pg.client import LeaseManager

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 120.0  # a bound for a hang, not a timed assertion


class Collector:
    """An OTLP/HTTP receiver: keeps every POST (path, body) and answers 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, bytes]] = []
        self.received = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.posts.append((self.path, body))
                outer.received.set()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def body(self) -> bytes:
        return b"".join(body for _, body in self.posts)


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ZEROTH_PG_"))}
    paths = [str(REPO / "tests" / "integration"), str(REPO / "tests")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


async def test_otel_variables_send_the_worker_spans_to_the_otlp_endpoint(
        database_dsn: str, pool: asyncpg.Pool, collector: Collector) -> None:
    dep = f"otel-{uuid.uuid4().hex[:8]}"
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "zeroth_pg.worker", "--dsn", database_dsn, "--deployment", dep,
        "--app", "worker_apps:tagged", "--poll-interval", "0.1", cwd=REPO,
        env=_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                 OTEL_SERVICE_NAME="orders-worker"),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(int(DEADLINE / 0.05)):
            status = await pool.fetchval(
                "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run)
            if status == "completed" or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert status == "completed"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=DEADLINE)
    log = err.decode(errors="replace")
    assert proc.returncode == 0, log
    assert "OpenTelemetry: sending the spans of service orders-worker to otlp" in log
    # Flushed at the worker's exit: the attempt's span reached the collector, with the
    # service name and the run id (OTLP protobuf carries strings as they are).
    assert {path for path, _ in collector.posts} == {"/v1/traces"}
    body = collector.body()
    assert f"process {dep}".encode() in body
    assert b"orders-worker" in body
    assert str(run).encode() in body


def _worker_without(module: str | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``zeroth-pg worker`` with ``module`` unimportable (as if not installed)."""
    hide = f"sys.modules[{module!r}] = None; " if module else ""
    code = (f"import sys; {hide}sys.argv = ['zeroth-pg', *sys.argv[1:]]; "
            "from zeroth_pg.cli import main; main()")
    return subprocess.run([sys.executable, "-c", code, "worker", *args], cwd=REPO,
                          env=_env(**env), capture_output=True, text=True, timeout=DEADLINE,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("hidden", "env", "says"), [
    ("opentelemetry.sdk", {}, "the OpenTelemetry SDK is not installed"),
    ("opentelemetry.exporter.otlp.proto.http.trace_exporter", {},
     "need opentelemetry-exporter-otlp-proto-http"),
    (None, {"OTEL_TRACES_EXPORTER": "zipkin-of-my-own"}, "unknown exporter 'zipkin-of-my-own'"),
])
def test_otel_asked_for_and_impossible_says_why_and_exits_2(
        database_dsn: str, hidden: str | None, env: dict[str, str], says: str) -> None:
    done = _worker_without(hidden, "--dsn", database_dsn, "--deployment", "otel-never",
                           "--app", "worker_apps:tagged", "--otel", **env)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    if hidden is not None:
        assert "pip install 'zeroth-pg[otel-export]'" in done.stderr


def test_the_variables_that_turn_traces_on() -> None:
    assert not tracing.wanted(False, {})
    assert tracing.wanted(True, {})
    assert tracing.wanted(False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing.wanted(False, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"})
    assert tracing.wanted(False, {"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.wanted(False, {"OTEL_SERVICE_NAME": "x"})  # names, does not ask
    assert not tracing.wanted(True, {"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.wanted(True, {"OTEL_SDK_DISABLED": "true",
                                     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
