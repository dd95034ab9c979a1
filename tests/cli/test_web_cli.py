"""``zeroth-pg web`` and ``zeroth-pg demo --web`` as subprocesses on a free port against the test
database: the dashboard answers /, the token guards it, and the process stops on SIGTERM.

Waiting is by condition: the URL line the command prints, then a GET that connects (a bounded
number of tries; the bound is a deadline for a hang, not a timed assertion)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

DEADLINE = 120.0
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], dsn: str, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ZEROTH_PG_")}
    clean.update(ZEROTH_PG_DSN=dsn, **env)
    return subprocess.Popen([sys.executable, "-m", "zeroth_pg.cli", *args], cwd=REPO, env=clean,
                            stdout=(tmp_path / "out").open("w"),
                            stderr=(tmp_path / "err").open("w"), text=True)


def wait_for_line(proc: subprocess.Popen[str], path: Path, needle: str) -> str:
    done = threading.Event()
    for _ in range(int(DEADLINE / 0.05)):
        text = path.read_text()
        if needle in text:
            return text
        assert proc.poll() is None, (path.read_text(), (path.parent / "err").read_text())
        done.wait(0.05)
    raise AssertionError(f"never printed {needle!r}: {path.read_text()}")


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """The first answer of ``url`` once the server listens (connection refused: retry)."""
    pause = threading.Event()
    for _ in range(int(DEADLINE / 0.05)):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                        timeout=30) as page:
                return page.status, page.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            pause.wait(0.05)
    raise AssertionError(f"{url} never answered")


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


class TestWebCommand:
    def test_serves_the_overview_and_stops_on_sigterm(self, database_dsn, tmp_path):
        port = free_port()
        proc = start(["web", "--port", str(port)], database_dsn, tmp_path)
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            status, body = get(f"http://127.0.0.1:{port}/")
            runs_status, _ = get(f"http://127.0.0.1:{port}/runs")
        finally:
            code = stop(proc)
        assert f"http://127.0.0.1:{port}/" in line
        assert "read-only" in line
        assert status == 200
        assert "Overview" in body
        assert runs_status == 200
        assert code in (0, -signal.SIGTERM), (tmp_path / "err").read_text()

    def test_the_token_from_the_environment_guards_it(self, database_dsn, tmp_path):
        port = free_port()
        proc = start(["web", "--port", str(port), "--enable-actions"], database_dsn, tmp_path,
                     ZEROTH_PG_WEB_TOKEN="t0ken")
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            refused, _ = get(f"http://127.0.0.1:{port}/")
            allowed, body = get(f"http://127.0.0.1:{port}/",
                                headers={"Authorization": "Bearer t0ken"})
        finally:
            stop(proc)
        assert "?token=…" in line
        assert "t0ken" not in line  # the URL shown never carries the token itself
        assert "actions enabled" in line
        assert (refused, allowed) == (401, 200)
        assert "actions enabled" in body


class TestDemoWeb:
    def test_the_demo_serves_its_dashboard_while_it_runs(self, database_dsn, tmp_path):
        # The killed worker's runs come back only after their 15 s lease expires, so the demo
        # is still running (and serving) when the page is fetched.
        port = free_port()
        proc = start(["demo", "--runs", "60", "--lease", "15", "--web", "--web-port", str(port),
                      "--json"], database_dsn, tmp_path)
        try:
            wait_for_line(proc, tmp_path / "err", "dashboard: http://")
            status, body = get(f"http://127.0.0.1:{port}/")
            workers, _ = get(f"http://127.0.0.1:{port}/workers")
            code = proc.wait(timeout=300)
        finally:
            if proc.returncode is None:
                stop(proc)
        assert status == 200
        assert "Overview" in body
        assert workers == 200
        assert code == 0, (tmp_path / "err").read_text()
        assert json.loads((tmp_path / "out").read_text())["runs"] == 60
