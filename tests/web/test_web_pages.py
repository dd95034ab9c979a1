"""zeroth-pg web over HTTP (Starlette's TestClient, lifespan included) against a real database:
every page, every action, escaping, CSRF, read-only mode, the token, a reader refused."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import asyncpg
import pytest
from child_calls import start_child
from helpers import dashboard, make_run
from roles import dsn_as, login_role

from zeroth_pg.web import create_app

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


async def _now(conn: asyncpg.Connection) -> datetime:
    value: datetime = await conn.fetchval("SELECT clock_timestamp()")
    return value


async def _dead_letter(conn: asyncpg.Connection, deployment: str, now: datetime,
                       **kwargs: object) -> object:
    run = await make_run(conn, "running", deployment_ref=deployment, max_attempts=1, now=now,
                         **kwargs)
    outcome = await conn.fetchval(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => $5::jsonb, retryable => true, now_override => $4,
               tenant_id => $6)""",
        run.run_id, run.worker_id, run.generation, now, json.dumps({"message": XSS}),
        kwargs.get("tenant_id"))
    assert outcome == "dead_lettered"
    return run.run_id


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


async def _status(conn: asyncpg.Connection, run_id: object) -> str:
    value: str = await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                     run_id)
    return value


class TestPages:
    async def test_every_page_renders_and_escapes_html_payloads(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            pending = await make_run(conn, "pending", deployment_ref=XSS, now=now,
                                     payload={"html": XSS}, idempotency_key=XSS)
            running = await make_run(conn, "running", deployment_ref="mail", now=now,
                                     worker_id=XSS, lease_seconds=600)
            dead = await _dead_letter(conn, "mail", now)
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            pages = {path: client.get(path) for path in
                     ["/", "/overview.json", "/runs", f"/runs/{pending.run_id}",
                      f"/runs/{running.run_id}", f"/runs/{dead}", "/dead-letters", "/workers",
                      "/runs?search=" + XSS]}
        for path, response in pages.items():
            assert response.status_code == 200, (path, response.text)
            assert "<script>alert" not in response.text, path
            assert "onerror=alert" not in response.text.replace("onerror=alert(1)&gt;", ""), path
        assert "&lt;script&gt;" in pages["/runs"].text
        assert str(pending.run_id) in pages["/runs?search=" + XSS].text  # idempotency key
        assert "&lt;script&gt;" in pages[f"/runs/{dead}"].text  # the error
        assert str(dead)[:12] in pages["/dead-letters"].text
        assert "&lt;script&gt;" in pages["/workers"].text  # the worker id
        assert "mail" in pages["/"].text
        assert "<svg" in pages["/"].text
        # Read-only: no action form is shown.
        assert 'action="/actions/' not in "".join(r.text for r in pages.values())

    async def test_runs_filters_and_keyset_pages(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.app.PAGE_SIZE", 3)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            ids = {str((await make_run(conn, "pending", deployment_ref="a", now=now)).run_id)
                   for _ in range(7)}
            other = await make_run(conn, "pending", deployment_ref="b", tenant_id="acme",
                                   now=now, thread_id="t-1")
        finally:
            await conn.close()
        seen: list[str] = []
        with dashboard(create_app(database_dsn)) as client:
            url: str | None = "/runs?deployment=a&status=pending"
            while url:
                page = client.get(url)
                assert page.status_code == 200
                seen += re.findall(r'href="/runs/([0-9a-f-]{36})[?"]', page.text)
                nxt = re.search(r'id="next" href="([^"]+)"', page.text)
                url = nxt.group(1).replace("&amp;", "&") if nxt else None
            by_thread = client.get("/runs?thread=t-1").text
            by_tenant = client.get("/runs?tenant=acme").text
            bad = client.get("/runs?since=yesterday")
        assert sorted(seen) == sorted(ids)
        assert len(seen) == 7
        assert str(other.run_id) in by_thread
        assert str(other.run_id) in by_tenant
        assert bad.status_code == 400
        assert "bad filter" in bad.text

    async def test_one_busy_minute_does_not_flatten_the_chart_of_the_others(self, database_dsn):
        """1,000 runs finished in one minute and a single one in another: on a linear scale the
        single run's bar would be a tenth of a pixel; the chart's logarithmic scale keeps it
        visible, labels its axes, and gives each bar's exact count in its tooltip."""
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute(
                "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => 'chart', runs => "
                "(SELECT jsonb_agg(jsonb_build_object('payload', '{}'::jsonb)) "
                "FROM generate_series(1, 1001)))")
            # A DBA's UPDATE plays the finished runs: 1,000 ten minutes ago, one five minutes ago.
            await conn.execute(
                "UPDATE zeroth.runs SET status = 'completed', finished_at = CASE "
                "WHEN run_id = (SELECT min(run_id::text)::uuid FROM zeroth.runs) "
                "THEN clock_timestamp() - interval '5 minutes' "
                "ELSE clock_timestamp() - interval '10 minutes' END")
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            page = client.get("/")
        assert page.status_code == 200
        chart = page.text[page.text.index('<svg class="chart"'):page.text.index("</svg>")]
        bars = {int(count): float(height) for height, count in re.findall(
            r'<rect class="ok"[^>]* height="([0-9.]+)"><title>[0-9:]+ completed (\d+)</title>',
            chart)}
        assert set(bars) == {1000, 1}
        assert bars[1] >= 0.08 * bars[1000] >= 7  # log(2)/log(1001) of the spike's height
        ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', chart)
        assert {"0", "1", "10", "100", "1000", "60 min ago", "now"} <= set(ticks)
        assert "logarithmic" in chart

    def test_unknown_and_malformed_run_ids(self, database_dsn):
        with dashboard(create_app(database_dsn)) as client:
            assert client.get("/runs/00000000-0000-0000-0000-000000000000").status_code == 404
            assert client.get("/runs/not-a-uuid").status_code == 400


class TestActions:
    async def test_redrive_one_all_matching_and_cancel_change_the_database(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            one = await _dead_letter(conn, "mail", now)
            more = [await _dead_letter(conn, "sms", now) for _ in range(2)]
            keep = await _dead_letter(conn, "mail", now)
            pending = await make_run(conn, "pending", deployment_ref="mail", now=now)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get(f"/runs/{one}").text)
                r = client.post("/actions/redrive", data={"run_id": str(one), "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                assert await _status(conn, one) == "pending"
                r = client.post("/actions/redrive-matching",
                                data={"deployment": "sms", "csrf": csrf}, follow_redirects=False)
                assert r.status_code == 303
                assert "redriven: 2" in client.get(r.headers["location"]).text
                assert [await _status(conn, m) for m in more] == ["pending", "pending"]
                assert await _status(conn, keep) == "failed"  # another deployment's
                r = client.post("/actions/cancel",
                                data={"run_id": str(pending.run_id), "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                assert await _status(conn, pending.run_id) == "cancelled"
                # Redriving a run that is not failed: the database's ZP003, shown, nothing done.
                r = client.post("/actions/redrive", data={"run_id": str(one), "csrf": csrf})
                assert r.status_code == 409
                assert "ZP003" in r.text
        finally:
            await conn.close()

    # Read-only, without or with a forged or another session's CSRF token: refused and nothing
    # changes, for every action (test_web_action_guards.py).

    async def test_a_reader_dsn_can_never_act_and_sees_its_tenant(self, database_dsn,
                                                                  pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            mine = await _dead_letter(conn, "mail", now, tenant_id="acme")
            theirs = await _dead_letter(conn, "mail", now, tenant_id="initech")
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                reader = dsn_as(database_dsn, name, password)
                with dashboard(create_app(reader, enable_actions=True)) as client:
                    dead_page = client.get("/dead-letters").text
                    runs_page = client.get("/runs?tenant=initech").text
                    hidden = client.get(f"/runs/{theirs}")
                    csrf = _csrf(client.get(f"/runs/{mine}").text)
                    r = client.post("/actions/redrive", data={"run_id": str(mine),
                                                              "csrf": csrf})
                    c = client.post("/actions/cancel", data={"run_id": str(mine),
                                                             "csrf": csrf})
            assert str(mine)[:12] in dead_page
            assert str(theirs)[:12] not in dead_page
            assert str(theirs) not in runs_page
            assert hidden.status_code == 404
            assert r.status_code == 403
            assert "42501" in r.text
            assert "refused" in r.text
            assert c.status_code == 403
            assert "42501" in c.text
            assert await _status(conn, mine) == "failed"
        finally:
            await conn.close()

    async def test_a_tenant_reader_sees_no_session_of_the_database(self, database_dsn,
                                                                  pg_server_dsn):
        # pg_stat_activity shows every session's application_name to any role: another
        # tenant's worker ('zeroth-worker:<its id>') is not this reader's to see.
        other = await asyncpg.connect(
            database_dsn, server_settings={"application_name": "zeroth-worker:initech-payroll"})
        try:
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await other.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                reader = dsn_as(database_dsn, name, password)
                with dashboard(create_app(reader)) as client:
                    as_reader = client.get("/workers")
            with dashboard(create_app(database_dsn)) as client:
                as_owner = client.get("/workers")
        finally:
            await other.close()
        assert as_reader.status_code == 200
        assert "initech-payroll" not in as_reader.text
        assert "every tenant" in as_reader.text
        assert "initech-payroll" in as_owner.text


FOREIGN_HOST = "rebind.attacker.example:18787"
FOREIGN_ORIGIN = f"http://{FOREIGN_HOST}"


class TestHostAndOrigin:
    """DNS rebinding: a page on a name the attacker points at 127.0.0.1 is same-origin with the
    dashboard, so its requests carry its own name as Host; a cross-site form posts with its own
    Origin. Both are refused before anything is read, set or changed."""

    async def test_a_foreign_host_gets_no_page_no_payload_and_no_cookie(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            run = await make_run(conn, "pending", deployment_ref="mail", now=await _now(conn),
                                 payload={"secret": "p4yload"})
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            for host in (FOREIGN_HOST, "rebind.attacker.example", "localhost.attacker.example",
                         "127.0.0.1.nip.io:8787", "user@127.0.0.1", ""):
                for path in ("/", "/overview.json", "/runs", f"/runs/{run.run_id}",
                             "/dead-letters", "/workers", "/static/web.js"):
                    r = client.get(path, headers={"Host": host})
                    assert r.status_code == 421, (host, path)
                    assert "set-cookie" not in r.headers, (host, path)
                    assert "p4yload" not in r.text
                    assert "mail" not in r.text
            for host in ("127.0.0.1:8787", "localhost:8787", "LOCALHOST", "[::1]:8787"):
                r = client.get(f"/runs/{run.run_id}", headers={"Host": host})
                assert r.status_code == 200, host
                assert "p4yload" in r.text

    def test_allowed_hosts_add_the_names_a_proxy_or_users_reach_it_by(self, database_dsn):
        app = create_app(database_dsn, allowed_hosts=["Dash.Example.com", "10.0.0.5"])
        with dashboard(app) as client:
            assert client.get("/", headers={"Host": "dash.example.com"}).status_code == 200
            assert client.get("/", headers={"Host": "10.0.0.5:8787"}).status_code == 200
            assert client.get("/", headers={"Host": "evil.example.com"}).status_code == 421

    def test_an_allowed_host_that_is_not_a_host_name_is_refused_clearly(self, database_dsn):
        # A URL or a user@host never equals a Host header: taken as given, every request of the
        # name the operator meant would get 421.
        for entry in ("http://dash.example.com", "dash.example.com/", "admin@dash.example.com",
                      "dash.example.com:port", "dash example.com"):
            with pytest.raises(ValueError, match="allowed host") as raised:
                create_app(database_dsn, allowed_hosts=[entry])
            assert repr(entry) in str(raised.value)

    async def test_a_post_from_another_origin_is_refused_and_changes_nothing(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            pending = await make_run(conn, "pending", deployment_ref="mail", now=await _now(conn))
            form = {"run_id": str(pending.run_id)}
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                form["csrf"] = _csrf(client.get(
                    f"/bulk?op=cancel&source=runs&search={pending.run_id}").text)
                # The rebinding page itself: its Host and its Origin are its own name.
                r = client.post("/actions/cancel", data=form,
                                headers={"Host": FOREIGN_HOST, "Origin": FOREIGN_ORIGIN})
                assert r.status_code == 421
                # Cross-site or cross-port pages posting to the real host, with the cookie and
                # token: refused on their Origin (or Referer when they send no Origin).
                for headers in ({"Origin": FOREIGN_ORIGIN}, {"Origin": "null"},
                                {"Origin": "http://127.0.0.1:3000"},
                                {"Origin": "https://127.0.0.1:8443"},
                                {"Origin": ""}):
                    r = client.post("/actions/cancel", data=form, headers=headers)
                    assert r.status_code == 403, headers
                    assert "Origin" in r.text
                del client.headers["origin"]
                for headers in ({}, {"Referer": f"{FOREIGN_ORIGIN}/runs"},
                                {"Referer": "http://127.0.0.1:3000/"}):
                    r = client.post("/actions/cancel", data=form, headers=headers)
                    assert r.status_code == 403, headers
                assert await _status(conn, pending.run_id) == "pending"
                # The dashboard's own page: a browser that sends only a Referer is accepted.
                r = client.post("/actions/cancel", data=form, follow_redirects=False,
                                headers={"Referer": f"http://127.0.0.1/runs/{pending.run_id}"})
                assert r.status_code == 303
            assert await _status(conn, pending.run_id) == "cancelled"
        finally:
            await conn.close()


class TestToken:
    def test_the_token_guards_every_page(self, database_dsn):
        app = create_app(database_dsn, token="s3cret")
        with dashboard(app) as client:
            for path in ["/", "/runs", "/dead-letters", "/workers", "/overview.json",
                         "/static/web.css"]:
                assert client.get(path).status_code == 401, path
            assert client.get("/?token=wrong").status_code == 401
            assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
            assert client.get("/?token=s3cret").status_code == 200
            assert client.get("/runs").status_code == 200  # the cookie it set

    def test_two_dashboards_on_one_host_name_keep_their_own_token_cookies(self, database_dsn):
        # Every dashboard has a token now; a cookie belongs to a host name, not a port: a second
        # dashboard's cookie replaced the first's, whose pages then answered 401.
        from starlette.testclient import TestClient

        first = create_app(database_dsn, token="first-t0ken")
        second = create_app(database_dsn, token="second-t0ken")
        both = {"Cookie": "zp_token_8787=first-t0ken; zp_token_8788=second-t0ken"}
        with TestClient(first, base_url="http://127.0.0.1:8787") as one, \
                TestClient(second, base_url="http://127.0.0.1:8788") as two:
            opened = two.get("/?token=second-t0ken")
            assert "zp_token_8788=second-t0ken" in opened.headers["set-cookie"]
            assert one.get("/runs", headers=both).status_code == 200
            assert two.get("/runs", headers=both).status_code == 200
            assert one.get("/runs", headers={"Cookie": "zp_token_8787=second-t0ken"}
                           ).status_code == 401

    def test_a_page_opened_with_the_token_sends_no_referer_carrying_it(self, database_dsn):
        # Its stylesheet, script and links would otherwise carry the whole URL, token included,
        # as their Referer.
        app = create_app(database_dsn, token="s3cret")
        with dashboard(app) as client:
            first = client.get("/runs?status=failed&token=s3cret")
            assert first.status_code == 200
            assert "zp_token=s3cret" in first.headers["set-cookie"]
            for path in ("/", "/runs", "/dead-letters", "/workers", "/runs/not-a-run"):
                r = client.get(path)
                assert r.headers["referrer-policy"] == "strict-origin", path
            assert first.headers["referrer-policy"] == "strict-origin"


class TestRunDetail:
    async def test_the_attempt_history_is_shown_escaped(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            run = await make_run(conn, "running", deployment_ref="mail", now=await _now(conn))
            with dashboard(create_app(database_dsn)) as client:
                before = client.get(f"/runs/{run.run_id}").text
                # The attempt ends failed with an error holding HTML (a DBA's UPDATE: the
                # trigger records it like any function's).
                await conn.execute(
                    """UPDATE zeroth.runs SET status = 'failed', finished_at = now(),
                              error = '{"message": "<b>boom</b>"}',
                              lease_worker_id = NULL, lease_acquired_at = NULL,
                              lease_expires_at = NULL, admission_slot = NULL
                        WHERE run_id = $1""", run.run_id)
                after = client.get(f"/runs/{run.run_id}").text
        finally:
            await conn.close()
        assert "Attempt history" in before
        assert "Steps" in before
        assert "Event waits" in before
        assert "failed" in after
        assert "&lt;b&gt;boom&lt;/b&gt;" in after
        assert "<b>boom</b>" not in after

    async def test_a_run_reads_as_its_operator_needs_it(self, database_dsn):
        """Parent and children linked both ways with their states, why a run waits, when a
        pending run is due, a running run whose lease expired flagged, a completed run's earlier
        failure not shown as its error, and a traceback with its real line breaks."""
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            parent = await make_run(conn, "running", deployment_ref="plan", now=now,
                                    lease_seconds=600)
            child = await start_child(conn, parent.run_id, parent.generation, "research",
                                      now=now)
            await conn.execute(
                """SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)""",
                child["child_run_id"], now)
            later = await make_run(conn, "pending", deployment_ref="plan", now=now,
                                   run_after=now + timedelta(hours=2))
            waiting = await make_run(conn, "waiting", deployment_ref="plan", now=now)
            orphan = await make_run(conn, "running", deployment_ref="plan",
                                    now=now - timedelta(hours=1), lease_seconds=5)
            retried = await make_run(conn, "running", deployment_ref="plan", now=now,
                                     lease_seconds=600)
            traceback = 'Traceback (most recent call last):\n  File "h.py", line 3\nValueError: x'
            await conn.execute(
                """UPDATE zeroth.runs SET status = 'completed', finished_at = now(),
                          output = '{}', lease_worker_id = NULL, lease_acquired_at = NULL,
                          lease_expires_at = NULL, admission_slot = NULL,
                          error = jsonb_build_object('type', 'ValueError', 'message', 'x',
                                                     'traceback', $2::text)
                    WHERE run_id = $1""", retried.run_id, traceback)
            with dashboard(create_app(database_dsn)) as client:
                page = {name: client.get(f"/runs/{run_id}").text for name, run_id in
                        [("parent", parent.run_id), ("child", child["child_run_id"]),
                         ("later", later.run_id), ("waiting", waiting.run_id),
                         ("orphan", orphan.run_id), ("retried", retried.run_id)]}
            wait_reason = await conn.fetchval(
                "SELECT wait_reason FROM zeroth.runs WHERE run_id = $1", waiting.run_id)
        finally:
            await conn.close()
        child_id = str(child["child_run_id"])
        assert f'href="/runs/{child_id}?' in page["parent"]
        assert "research" in page["parent"]
        assert '<span class="st cancelled">cancelled</span>' in page["parent"]
        assert f'href="/runs/{parent.run_id}?' in page["child"]  # and back to the parent
        assert 'id="due-at"' in page["later"]
        assert 'id="wait-reason"' in page["waiting"]
        assert wait_reason in page["waiting"]
        assert 'id="lease-expired"' in page["orphan"]
        assert 'id="lease-expired"' not in page["parent"]
        assert "Last failure" in page["retried"]
        assert '<h2 id="failure-title">Error' not in page["retried"]
        assert "ValueError: x" in page["retried"]
        assert 'File &#34;h.py&#34;, line 3\nValueError' in page["retried"]  # real line breaks
        assert "\\n" not in page["retried"].split('class="trace">', 1)[1].split("</pre>", 1)[0]

    async def test_a_reader_sees_its_own_tenants_children_only(self, database_dsn,
                                                              pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            ids = {}
            for tenant in ("acme", "globex"):
                parent = await make_run(conn, "running", deployment_ref="plan", now=now,
                                        tenant_id=tenant, lease_seconds=600)
                child = await start_child(conn, parent.run_id, parent.generation, "c",
                                          tenant=tenant, now=now)
                ids[tenant] = (parent.run_id, child["child_run_id"])
        finally:
            await conn.close()
        with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
            reader = await asyncpg.connect(dsn_as(database_dsn, name, password),
                                           server_settings={"zeroth.tenant_id": "acme"})
            try:
                seen = {row["child_run_id"] for row in
                        await reader.fetch("SELECT child_run_id FROM zeroth.child_list")}
                raw = await reader.fetch("SELECT child_run_id FROM zeroth.child_runs")
            finally:
                await reader.close()
        assert seen == {ids["acme"][1]}
        assert {row["child_run_id"] for row in raw} == {ids["acme"][1]}
