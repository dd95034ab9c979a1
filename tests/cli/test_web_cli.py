"""``zeroth-pg web`` and ``zeroth-pg demo --web`` as subprocesses on a free port against the test
database: the dashboard answers /, the token guards it, and the process stops on SIGTERM. The
requests a DNS-rebinding or cross-site page sends (a foreign Host, a foreign Origin) are sent raw
(http.client) to the real process and refused; actions and a network bind need a token, which the
command generates and prints when ZEROTH_PG_WEB_TOKEN is unset.

Waiting is by condition: the URL line the command prints, then a GET that connects (a bounded
number of tries; the bound is a deadline for a hang, not a timed assertion)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from uuid import UUID

import asyncpg

from zeroth_pg.client import LeaseManager

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


def printed_token(line: str) -> dict[str, str]:
    """The headers that carry the token ``zeroth-pg web`` generated and printed in ``line``."""
    found = re.search(r"\?token=([A-Za-z0-9_-]{20,})", line)
    assert found, line
    return {"Authorization": f"Bearer {found.group(1)}"}


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()


def raw(port: int, method: str, path: str, headers: dict[str, str],
        form: str | None = None) -> tuple[int, http.client.HTTPMessage, str]:
    """One request to 127.0.0.1:port with exactly ``headers`` (Host included, as a browser on a
    rebound name sends it): status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        body = form.encode() if form is not None else None
        if body is not None:
            conn.putheader("Content-Type", "application/x-www-form-urlencoded")
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.msg, response.read().decode()
    finally:
        conn.close()


REBOUND = "rebind.attacker.example"


async def _pending_run(dsn: str, secret: str) -> UUID:
    conn = await asyncpg.connect(dsn)
    try:
        queued = await LeaseManager(conn).enqueue_run(  # type: ignore[arg-type]
            "web-origin", {"secret": secret})
        return queued.run_id
    finally:
        await conn.close()


async def _status(dsn: str, run_id: UUID) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        value: str = await conn.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id)
        return value
    finally:
        await conn.close()


class TestHostileRequests:
    async def test_a_rebinding_page_gets_no_page_payload_or_cookie(self, database_dsn, tmp_path):
        run_id = await _pending_run(database_dsn, "p4yload")
        port = free_port()
        proc = start(["web", "--port", str(port)], database_dsn, tmp_path)
        try:
            token = printed_token(wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://"))
            own, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/runs/{run_id}",
                                             token)
            # The rebound page even holds the token: the Host alone refuses it.
            hostile = {path: await asyncio.to_thread(
                           raw, port, "GET", path, {"Host": f"{REBOUND}:{port}", **token})
                       for path in ("/", "/overview.json", f"/runs/{run_id}", "/runs")}
        finally:
            stop(proc)
        assert own == 200
        for path, (status, headers, body) in hostile.items():
            assert status == 421, path
            assert headers.get_all("Set-Cookie") is None, path
            assert "p4yload" not in body
            assert "web-origin" not in body

    async def test_actions_need_the_generated_token_and_the_dashboard_origin(
            self, database_dsn, tmp_path):
        run_id = await _pending_run(database_dsn, "p4yload")
        port = free_port()
        proc = start(["web", "--port", str(port), "--enable-actions"], database_dsn, tmp_path)
        own = {"Host": f"127.0.0.1:{port}"}
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            found = re.search(r"\?token=([A-Za-z0-9_-]{20,})", line)
            assert found, line
            token = found.group(1)
            without, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/")
            # The run's Cancel asks first: its confirmation page carries the CSRF token.
            status, headers, page = await asyncio.to_thread(
                raw, port, "GET", f"/bulk?op=cancel&source=runs&search={run_id}",
                {**own, "Authorization": f"Bearer {token}"})
            assert status == 200
            cookie = next(c.split(";")[0] for c in headers.get_all("Set-Cookie") or []
                          if c.startswith("zp_session="))
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
            assert csrf
            form = f"run_id={run_id}&csrf={csrf.group(1)}"
            browser = {"Authorization": f"Bearer {token}", "Cookie": cookie}
            # The rebound page, even holding the cookie, the token and the CSRF token.
            rebound = await asyncio.to_thread(
                raw, port, "POST", "/actions/cancel",
                {**browser, "Host": f"{REBOUND}:{port}", "Origin": f"http://{REBOUND}:{port}"},
                form)
            cross_site = await asyncio.to_thread(
                raw, port, "POST", "/actions/cancel",
                {**browser, **own, "Origin": f"http://{REBOUND}:{port}"}, form)
            no_origin = await asyncio.to_thread(
                raw, port, "POST", "/actions/cancel", {**browser, **own}, form)
            untouched = await _status(database_dsn, run_id)
            same_origin = await asyncio.to_thread(
                raw, port, "POST", "/actions/cancel",
                {**browser, **own, "Origin": f"http://127.0.0.1:{port}"}, form)
        finally:
            stop(proc)
        assert "token generated" in line
        assert "actions enabled" in line
        assert without == 401
        assert rebound[0] == 421
        assert cross_site[0] == 403
        assert no_origin[0] == 403
        assert untouched == "pending"
        assert same_origin[0] == 303, same_origin[2]
        assert await _status(database_dsn, run_id) == "cancelled"

    def test_a_network_bind_without_a_token_generates_one_and_warns(self, database_dsn,
                                                                   tmp_path):
        port = free_port()
        proc = start(["web", "--host", "0.0.0.0", "--port", str(port)], database_dsn, tmp_path,
                     ZEROTH_PG_WEB_ALLOWED_HOSTS="dash.example.com, other.example")
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            found = re.search(r"\?token=([A-Za-z0-9_-]{20,})", line)
            assert found, line
            bearer = {"Authorization": f"Bearer {found.group(1)}"}
            without, _ = get(f"http://127.0.0.1:{port}/")
            with_token, _ = get(f"http://127.0.0.1:{port}/", headers=bearer)
            named = raw(port, "GET", "/", {"Host": f"dash.example.com:{port}", **bearer})
            other = raw(port, "GET", "/", {"Host": "other.example", **bearer})
            foreign = raw(port, "GET", "/", {"Host": f"{REBOUND}:{port}", **bearer})
        finally:
            stop(proc)
        warning = (tmp_path / "err").read_text()
        assert "warning" in warning
        assert "--host 0.0.0.0" in warning
        assert (without, with_token) == (401, 200)
        assert (named[0], other[0], foreign[0]) == (200, 200, 421)

    def test_a_name_users_reach_through_a_proxy_needs_the_token_too(self, database_dsn,
                                                                     tmp_path):
        # Bound to loopback behind a proxy that passes Host: dash.example.com, the dashboard
        # serves the network as surely as a network bind does.
        port = free_port()
        proc = start(["web", "--port", str(port), "--allowed-host", "dash.example.com"],
                     database_dsn, tmp_path)
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            found = re.search(r"\?token=([A-Za-z0-9_-]{20,})", line)
            assert found, line
            bearer = {"Authorization": f"Bearer {found.group(1)}"}
            loopback, _ = get(f"http://127.0.0.1:{port}/")  # once it listens
            via_proxy = raw(port, "GET", "/", {"Host": "dash.example.com"})
            with_token = raw(port, "GET", "/", {"Host": "dash.example.com", **bearer})
        finally:
            stop(proc)
        assert "read-only" in line
        assert (loopback, via_proxy[0], with_token[0]) == (401, 401, 200)
        assert "dash.example.com" in (tmp_path / "err").read_text()


class TestWebCommand:
    def test_serves_the_overview_and_stops_on_sigterm(self, database_dsn, tmp_path):
        port = free_port()
        proc = start(["web", "--port", str(port)], database_dsn, tmp_path)
        try:
            line = wait_for_line(proc, tmp_path / "out", "zeroth-pg web: http://")
            token = printed_token(line)
            status, body = get(f"http://127.0.0.1:{port}/", token)
            runs_status, _ = get(f"http://127.0.0.1:{port}/runs", token)
            # The read-only dashboard on loopback needs its token too: every local user and
            # process can reach 127.0.0.1.
            without, _ = get(f"http://127.0.0.1:{port}/runs")
        finally:
            code = stop(proc)
        assert f"http://127.0.0.1:{port}/?token=" in line
        assert "read-only" in line
        assert "token generated" in line
        assert without == 401
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


    def test_an_allowed_host_that_is_not_a_name_stops_it_with_a_usage_error(self, database_dsn,
                                                                           tmp_path):
        proc = start(["web", "--port", str(free_port()), "--allowed-host",
                      "https://dash.example.com"], database_dsn, tmp_path)
        try:
            code = proc.wait(timeout=DEADLINE)
        finally:
            if proc.returncode is None:
                stop(proc)
        err = (tmp_path / "err").read_text()
        assert code == 2, err
        assert "https://dash.example.com" in err
        assert "zeroth-pg web: http://" not in (tmp_path / "out").read_text()


class TestDemoWeb:
    def test_the_demo_serves_its_dashboard_while_it_runs(self, database_dsn, tmp_path):
        # The killed worker's runs come back only after their 15 s lease expires, so the demo
        # is still running (and serving) when the page is fetched.
        port = free_port()
        proc = start(["demo", "--runs", "60", "--lease", "15", "--web", "--web-port", str(port),
                      "--json"], database_dsn, tmp_path)
        try:
            token = printed_token(wait_for_line(proc, tmp_path / "err", "dashboard: http://"))
            status, body = get(f"http://127.0.0.1:{port}/", token)
            workers, _ = get(f"http://127.0.0.1:{port}/workers", token)
            without, _ = get(f"http://127.0.0.1:{port}/workers")
            code = proc.wait(timeout=300)
        finally:
            if proc.returncode is None:
                stop(proc)
        assert status == 200
        assert "Overview" in body
        assert workers == 200
        assert without == 401
        assert code == 0, (tmp_path / "err").read_text()
        assert json.loads((tmp_path / "out").read_text())["runs"] == 60
