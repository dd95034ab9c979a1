"""The dashboard, the standalone exporter and a hurried worker against a page in the operator's
browser and a hostile local client: a foreign Host at the exporter (DNS rebinding), a POST body
larger than any form, forged cursors and time filters out of range, JSON nested deeper than
Python parses (an event payload, a step result on the run page), filters longer than any name,
and a handler that swallows its cancellation after a second SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import dashboard

from zeroth_pg import fleet_metrics, metrics
from zeroth_pg.metrics import default_metrics
from zeroth_pg.web import create_app


async def _raw_get(port: int, host_header: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host_header}\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_the_metrics_exporter_refuses_a_foreign_host_as_the_dashboard_does(admin,
                                                                                 database_dsn):
    # A page on attacker.example whose DNS name is rebound to 127.0.0.1 fetches
    # http://attacker.example:9641/metrics same-origin: its browser sends Host
    # attacker.example. The dashboard's /metrics answers that 421 (test_web_metrics); the
    # standalone exporter, bound to loopback for the same reason, must too, or any web page the
    # operator opens reads every deployment's name and queue depths.
    dep = f"secret-deployment-{uuid.uuid4().hex[:8]}"
    await admin.execute("SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => 'acme')",
                        dep)
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(fleet_metrics.serve(database_dsn, port=0,
                                                     on_ready=bound.set_result))
    try:
        port = await bound
        own = await _raw_get(port, f"127.0.0.1:{port}")
        foreign = await _raw_get(port, f"attacker.example:{port}")
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    assert own.startswith(b"HTTP/1.1 200")
    assert dep.encode() in own
    assert dep.encode() not in foreign, "a DNS-rebinding page read the fleet's gauges"
    assert foreign.startswith(b"HTTP/1.1 421")


async def test_a_worker_s_metrics_port_refuses_a_foreign_host(admin):
    # `zeroth-pg worker --metrics-port` served prometheus-client's plain server, which answers
    # any Host: a rebinding page read deployment names and counts (tenants too, with
    # --scope-metrics). It answers only loopback names and its own address now.
    dep = f"secret-deployment-{uuid.uuid4().hex[:8]}"
    default_metrics().runs_started.labels(dep).inc()
    server = metrics.start_http_server(0)
    try:
        port = server.server_port
        own = await _raw_get(port, f"localhost:{port}")
        foreign = await _raw_get(port, f"attacker.example:{port}")
        hostless = await _raw_get_without_host(port)
    finally:
        server.shutdown()
        server.server_close()
    assert own.startswith(b"HTTP/1.0 200")
    assert dep.encode() in own
    assert foreign.startswith(b"HTTP/1.0 421")
    assert dep.encode() not in foreign, "a DNS-rebinding page read the worker's metrics"
    assert hostless.startswith(b"HTTP/1.0 421")


async def test_a_worker_s_metrics_port_on_ipv6_or_every_address_answers_its_allowed_names():
    # prometheus-client's server picked the address's family; a wildcard bind is scraped by the
    # machine's name, which only allowed_hosts can add.
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"this machine has no IPv6 loopback to bind: {exc}")
    loopback6 = metrics.start_http_server(0, addr="::1")
    everywhere = metrics.start_http_server(0, addr="0.0.0.0", allowed_hosts=["node-7.internal"])
    try:
        reader, writer = await asyncio.open_connection("::1", loopback6.server_port)
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: [::1]:{loopback6.server_port}\r\n"
                     "Connection: close\r\n\r\n".encode())
        own6 = await reader.read()
        writer.close()
        named = await _raw_get(everywhere.server_port, f"node-7.internal:{everywhere.server_port}")
        other = await _raw_get(everywhere.server_port, f"attacker.example:{everywhere.server_port}")
    finally:
        for server in (loopback6, everywhere):
            server.shutdown()
            server.server_close()
    assert own6.startswith(b"HTTP/1.0 200")
    assert named.startswith(b"HTTP/1.0 200")
    assert other.startswith(b"HTTP/1.0 421")


async def _raw_get_without_host(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_post_body_is_not_read_past_its_bound_before_it_is_refused(database_dsn):
    # The dashboard as shipped by default: read-only, loopback, no token. Every POST is answered
    # "actions are disabled" (403), but only after the whole body was read into memory
    # (app._check_post: `(await request.body())[:65536]`): any local process (or anyone who
    # reaches an --allowed-host without a token) makes the dashboard buffer a body of any size.
    # A body past the form's 64 KiB bound must be refused (413) without being read to its end.
    # Driven as the ASGI server drives it (TestClient buffers a body itself before the app
    # sees it), counting the chunks the app pulls.
    chunk = b"a" * 65536
    offered = 2048  # 128 MiB
    pulled = 0
    answered: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": chunk, "more_body": pulled < offered}

    async def send(message: dict[str, object]) -> None:
        answered.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/actions/redrive", "raw_path":
             b"/actions/redrive", "query_string": b"", "root_path": "",
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080),
             "headers": [(b"host", b"127.0.0.1:8080"), (b"origin", b"http://127.0.0.1:8080"),
                         (b"content-type", b"application/x-www-form-urlencoded"),
                         (b"content-length", str(offered * len(chunk)).encode())]}
    await create_app(database_dsn)(scope, receive, send)
    status = next(m["status"] for m in answered if m["type"] == "http.response.start")
    assert status in (403, 413)
    assert pulled < offered, (
        f"the dashboard read all {pulled * len(chunk) >> 20} MiB of a POST body before "
        f"answering {status}")


async def test_bulk_confirmation_never_acts_on_a_get(admin, database_dsn):
    # Held (kept as a guard): the GET confirmation selects and shows, and changes nothing.
    run_id = await admin.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'bulk-get', tenant_id => 'a')")
    with dashboard(create_app(database_dsn, enable_actions=True)) as client:
        page = client.get("/bulk?op=cancel&source=runs&deployment=bulk-get")
    assert page.status_code == 200
    assert str(run_id) in page.text
    status = await admin.fetchval(
        "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id)
    assert status == "pending"


def test_a_forged_cursor_or_time_filter_out_of_range_is_a_clear_400(database_dsn):
    # parse_cursors / parse_run_filters accept any time datetime.fromisoformat parses; one that
    # PostgreSQL's timestamptz cannot hold (year 1 east of UTC, year 9999 west of it) reaches the
    # query and comes back as a database error: a 500 page "the database answered an error
    # (22000)". A forged cursor is bad input: a 400 naming it, before any query.
    zero = "00000000-0000-0000-0000-000000000000"
    forged = [f"/runs?after_at=0001-01-01T00:00:00%2B05:00&after_id={zero}",
              f"/runs?before_at=9999-12-31T23:59:59-05:00&before_id={zero}",
              "/runs?since=0001-01-01T00:00:00%2B05:00",
              f"/dead-letters?after_at=0001-01-01T00:00:00%2B05:00&after_id={zero}",
              "/bulk?op=cancel&source=runs&until=0001-01-01T00:00:00%2B05:00"]
    with dashboard(create_app(database_dsn, enable_actions=True),
                   raise_server_exceptions=False) as client:
        answers = {path: client.get(path).status_code for path in forged}
    assert all(code == 400 for code in answers.values()), answers


async def test_a_deeply_nested_event_payload_is_a_clear_400_and_emits_nothing(admin,
                                                                            database_dsn):
    # form_json bounds the payload's length (32 KiB) and catches ValueError, but 20,000
    # characters of nested arrays make json.loads raise RecursionError: an unhandled exception,
    # a bare 500, where bad input must get a 400 naming the field.
    name = f"deep-{uuid.uuid4().hex[:8]}"
    payload = "[" * 10_000 + "]" * 10_000
    with dashboard(create_app(database_dsn, enable_actions=True),
                   raise_server_exceptions=False) as client:
        page = client.get("/events")
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        answer = client.post("/actions/emit-event", data={
            "csrf": csrf, "name": name, "tenant": "acme", "payload": payload})
    assert answer.status_code == 400, (answer.status_code, answer.text[:200])
    assert "payload" in answer.text
    assert await admin.fetchval("SELECT count(*) FROM zeroth.events WHERE name = $1", name) == 0


async def test_a_deeply_nested_step_result_does_not_break_its_run_page(admin, database_dsn):
    # A zeroth_worker member may record any jsonb as a step's result (or an attempt's error);
    # the run page's new timeline previews each through json.loads (pages_runs._preview, which
    # catches ValueError only), and a result nested a few thousand deep raises RecursionError:
    # the run's page is a bare 500 and the operator can no longer look at that run at all.
    deep = "[" * 5_000 + "]" * 5_000
    dep = f"deep-{uuid.uuid4().hex[:8]}"
    run_id = await admin.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => 'acme')", dep)
    generation = await admin.fetchval(
        """SELECT lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => 'w1', tenant_id => 'acme', lease_seconds => 600)
            WHERE run_id IS NOT NULL""", dep)
    assert await admin.fetchval(
        """SELECT recorded FROM zeroth.record_step(run_id => $1, worker_id => 'w1',
               generation => $2, step_key => 'deep', result => $3::text::jsonb,
               tenant_id => 'acme')""", run_id, generation, deep)
    with dashboard(create_app(database_dsn), raise_server_exceptions=False) as client:
        page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200, page.text[:200]
    assert str(run_id) in page.text


async def _claimed(admin: Any, dep: str, **enqueue: Any) -> tuple[uuid.UUID, int]:
    extra = "".join(f", {name} => ${n}" for n, name in enumerate(enqueue, start=2))
    run_id = await admin.fetchval(
        f"SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => 'acme'{extra})",
        dep, *enqueue.values())
    generation = await admin.fetchval(
        """SELECT lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => 'w1', tenant_id => 'acme', lease_seconds => 600)
            WHERE run_id IS NOT NULL""", dep)
    return run_id, generation


async def test_pages_show_a_bounded_part_of_what_handlers_and_callers_stored(admin, database_dsn):
    # A caller's payload, a handler's output, its steps and a dead letter's error are theirs to
    # size: the run page printed every one whole (4 MB for a 2 MB output and 250 steps), the
    # dead-letter page 50 errors of up to a megabyte each, and both refresh every few seconds.
    # Each value is now cut (and says so), each list of the run page bounded, and the database
    # sends no more.
    dep = f"huge-{uuid.uuid4().hex[:8]}"
    big = {"blob": "p" * 600_000}
    run_id, generation = await _claimed(admin, dep, payload=json.dumps(big))
    for n in range(250):
        await admin.execute(
            """SELECT zeroth.record_step(run_id => $1, worker_id => 'w1', generation => $2,
                   step_key => $3, result => $4::text::jsonb, tenant_id => 'acme')""",
            run_id, generation, f"step-{n:03}", json.dumps({"r": "s" * 5_000}))
    assert await admin.fetchval(
        """SELECT zeroth.complete_run(run_id => $1, worker_id => 'w1', generation => $2,
               output => $3::text::jsonb, tenant_id => 'acme')""",
        run_id, generation, json.dumps({"o": "o" * 2_000_000}))
    dead, dead_generation = await _claimed(admin, dep, max_attempts=1)
    await admin.execute(
        """SELECT zeroth.fail_run(run_id => $1, worker_id => 'w1', generation => $2,
               error => $3::text::jsonb, retryable => true, tenant_id => 'acme')""",
        dead, dead_generation, json.dumps({"type": "Huge", "message": "e" * 500_000}))
    with dashboard(create_app(database_dsn)) as client:
        run_page = client.get(f"/runs/{run_id}")
        dead_page = client.get("/dead-letters", params={"deployment": dep})
        dead_run_page = client.get(f"/runs/{dead}")
    assert run_page.status_code == dead_page.status_code == 200
    assert len(run_page.content) < 300_000, len(run_page.content)
    assert "cut here: only the first 20,000 characters are shown" in run_page.text
    assert "cut here: only the first 1,000 characters are shown" in run_page.text  # a step
    assert "only the latest 100 are shown: read the rest in SQL (zeroth.step_list)" \
        in run_page.text
    assert "step-249" in run_page.text  # the latest steps, not the first
    assert "step-000" not in run_page.text
    assert len(dead_page.content) < 100_000, len(dead_page.content)
    assert str(dead) in dead_page.text
    assert "cut here: only the first 1,000 characters are shown" in dead_page.text
    # A long error document is cut field by field: it still reads as "type: message" (in the
    # Error section and the attempt history), not as a cut JSON text.
    assert dead_run_page.text.count("<summary>Huge: eeee") >= 2
    assert "{&#34;type&#34;: &#34;Huge&#34;" not in dead_run_page.text


async def test_the_overview_lists_a_bounded_number_of_scopes(admin, database_dsn):
    # Tenant ids are the caller's: 20,000 of them made /overview.json 13 MB, fetched every 2 s.
    dep = f"tenants-{uuid.uuid4().hex[:8]}"
    await admin.execute(
        """SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => 't-' || n)
             FROM generate_series(1, 600) AS n""", dep)
    with dashboard(create_app(database_dsn)) as client:
        html = client.get("/overview.json").json()["html"]
    assert html.count("<tr>") <= 501  # the header row and at most 500 scopes
    assert "only the first 500 scopes are shown: <code>zeroth-pg status</code> lists every one" \
        in html


def test_pages_of_run_data_are_kept_by_no_cache_and_never_sniffed(database_dsn):
    # The pages carry payloads, errors and the CSRF token: a shared proxy or the browser's disk
    # cache kept them (no Cache-Control), and no response said nosniff.
    with dashboard(create_app(database_dsn)) as client:
        for path in ("/", "/overview.json", "/runs", "/dead-letters", "/runs/not-a-run-id"):
            answer = client.get(path)
            assert answer.headers.get("cache-control") == "no-store", path
            assert answer.headers.get("x-content-type-options") == "nosniff", path


_REPO = Path(__file__).resolve().parents[2]
_STUBBORN = """
import asyncio, sys

async def stubborn(ctx):
    sys.stderr.write(f"stubborn handler started {ctx.run_id}\\n")
    sys.stderr.flush()
    while True:  # a bad handler: every cancellation is swallowed
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            sys.stderr.write("stubborn handler swallowed a cancellation\\n")
            sys.stderr.flush()
"""


async def test_a_hurried_worker_exits_even_when_a_handler_swallows_its_cancellation(
        admin, database_dsn, tmp_path):
    # hurry() (a second SIGTERM) promises: "a handler that ignores its cancellation holds the
    # exit no longer than a lease" (RunWorker.graceful_shutdown, lease 2 s here). The worker
    # logs "abandoning it" and "stopped", but the process never ends: asyncio.run, after serve()
    # returns, cancels every task left and waits for each (the abandoned handler's task too),
    # so the process hangs until a third signal kills it. Waits for the exit with a generous
    # cap (a liveness check, not a timing one).
    (tmp_path / "stubborn_app.py").write_text(_STUBBORN)
    dep = f"stubborn-{uuid.uuid4().hex[:8]}"
    run_id = await admin.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => 'acme')", dep)
    repo = _REPO
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "zeroth_pg.worker", "--dsn", database_dsn, "--deployment", dep,
        "--tenant", "acme", "--app", "stubborn_app:stubborn", "--worker-id", "w-stubborn",
        "--lease", "2", "--shutdown-timeout", "3600", "--poll-interval", "0.5",
        "--log-level", "INFO", cwd=repo, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    lines: list[str] = []

    async def until(needle: str) -> None:
        assert proc.stderr is not None
        while not any(needle in line for line in lines):
            raw = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert raw, "\n".join(lines)
            lines.append(raw.decode(errors="replace"))

    try:
        await until(f"stubborn handler started {run_id}")
        proc.send_signal(signal.SIGTERM)
        await until("draining 1 run(s)")
        proc.send_signal(signal.SIGTERM)
        await until("abandoning it")
        # The line says where the handler waits: its own code, under the await it swallows.
        abandoned = next(line for line in lines if "abandoning it" in line)
        assert "in sleep < stubborn_app.py:" in abandoned, abandoned
        assert " in stubborn" in abandoned, abandoned
        await until("worker w-stubborn stopped")
        drain = asyncio.create_task(until("never printed"))
        try:
            code = await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            code = None
        drain.cancel()
        with contextlib.suppress(BaseException):
            await drain
        assert code is not None, ("the hurried worker logged 'stopped' but its process did "
                                  "not exit:\n" + "".join(lines[-8:]))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_the_runs_and_dead_letter_filters_are_bounded_like_every_other_page(database_dsn):
    # /events, /schedules and /deployments/scope refuse a name past NAME_MAX (200) with a 400
    # (_shared.form_optional_name); the runs list, the dead letters and the bulk confirmation
    # take a filter of any length (parse_run_filters checks NUL only) and encode it back into
    # every page, cursor and bulk link, and into the confirmation's hidden fields.
    long = "x" * 5_000
    paths = [f"/runs?deployment={long}", f"/runs?thread={long}", f"/runs?search={long}",
             f"/dead-letters?tenant={long}", f"/bulk?op=cancel&source=runs&tenant={long}",
             f"/events?deployment={long}"]
    with dashboard(create_app(database_dsn, enable_actions=True)) as client:
        answers = {path.split("=", 1)[0] + "=…": client.get(path).status_code for path in paths}
    assert all(code == 400 for code in answers.values()), answers


# A link the attacker chose, opened in the operator's browser (a web page, a phishing mail): the
# message parameters an action's redirect used to carry in clear.
_FORGED_MESSAGES = [
    "/schedules?done=delete+every+schedule+ATTACKER-TEXT",
    "/events?emitted=ATTACKER-TEXT&woken=9999&repeat=",
    "/deployments?done=ATTACKER-TEXT",
    "/dead-letters?done=ATTACKER-TEXT",
    "/deployments/scope?deployment=mail&tenant=default&done=ATTACKER-TEXT",
]


def _says_done(html: str) -> bool:
    return ('<p class="ok-t"' in html or "ATTACKER-TEXT" in html
            or "runs woken" in html or "redriven:" in html)


@pytest.mark.parametrize("path", _FORGED_MESSAGES)
def test_a_crafted_link_cannot_make_the_dashboard_show_a_message(database_dsn, path):
    # Before: every page printed its ?done= / ?emitted= parameter as the green "done" line, so
    # a link could make the dashboard confirm an action nobody took, in the attacker's words.
    with dashboard(create_app(database_dsn, enable_actions=True)) as client:
        client.get("/")  # the operator's browser has a session
        page = client.get(path)
    assert page.status_code == 200, page.text[:300]
    assert not _says_done(page.text), "a crafted link put its message on the page"


async def test_a_forged_tampered_or_borrowed_flash_value_shows_nothing(admin, database_dsn):
    # The real message rides on a signed flash value: one that verifies only for the browser
    # (session) it was made for, unchanged, in this dashboard process.
    await admin.execute("SELECT zeroth.create_schedule(name => 'hourly', "
                        "deployment_ref => 'reports', interval_seconds => 3600)")
    app = create_app(database_dsn, enable_actions=True)
    with dashboard(app) as client:
        page = client.get("/schedules").text
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        answer = client.post("/actions/schedule", data={"name": "hourly", "tenant": "default",
                                                        "workspace": "", "op": "pause",
                                                        "csrf": csrf},
                             follow_redirects=False)
        assert answer.status_code == 303
        location = answer.headers["location"]
        assert "done=" not in location
        assert "flash=" in location
        assert "done: pause hourly" in client.get(location).text  # the operator sees it
        token = location.split("flash=", 1)[1]
        body, mac = token.rsplit(".", 1)
        expires, packed = body.split(".", 1)
        evil = base64.urlsafe_b64encode(b"done=ATTACKER-TEXT").decode()
        forged = [f"{expires}.{evil}.{mac}",                       # other text, same MAC
                  f"{int(expires) + 10**6}.{packed}.{mac}",         # a longer life
                  f"{body}.{'0' * len(mac)}",                       # a made-up MAC
                  f"{expires}.{evil}.",                             # no MAC
                  "x" * 5000]
        for value in forged:
            assert not _says_done(client.get(f"/schedules?flash={value}").text), value
    # Another browser (another session) given the operator's own link: nothing.
    with dashboard(app) as other:
        other.get("/")
        assert not _says_done(other.get(location).text)
    # The same link in a dashboard process restarted (a new secret): nothing.
    with dashboard(create_app(database_dsn, enable_actions=True)) as restarted:
        restarted.cookies.set("zp_session", client.cookies.get("zp_session") or "")
        assert not _says_done(restarted.get(location).text)
