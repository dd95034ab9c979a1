"""The dashboard pages an operator runs a fleet from (issue 31, item 5), over HTTP against a real
database: deployments (counts by state, pause / resume / concurrency / weight / rate limit),
schedules (pause / resume / fire now), events (waiting runs and what they wait for; emit),
workers as the database sees them (live, expired, idle, gone), and the run page's timeline with
one short timestamp format. Every action: done with actions enabled, with bad input (nothing
changes); a zeroth_reader sees only its tenant. The guards every action shares (read-only,
the CSRF token, a foreign Origin or Host, a reader refused): test_web_action_guards.py."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from child_calls import start_child, wait_children
from helpers import dashboard, make_run
from roles import dsn_as, login_role

from zeroth_pg.web import create_app

XSS = '<script>alert("x")</script>'


async def _now(conn: asyncpg.Connection) -> datetime:
    value: datetime = await conn.fetchval("SELECT clock_timestamp()")
    return value


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


def _unescaped_script(html: str) -> bool:
    return "<script>alert" in html


async def _schedule(conn: asyncpg.Connection, name: str, *, deployment: str = "reports",
                    tenant: str | None = None) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth.create_schedule(name => $1, deployment_ref => $2,
               interval_seconds => 3600, tenant_id => $3, payload => '{"job": 1}')""",
        name, deployment, tenant)


async def _wait_for_event(conn: asyncpg.Connection, event: str, *, tenant: str | None = None,
                          deployment: str = "approvals") -> Any:
    now = await _now(conn)
    lease = await make_run(conn, "running", deployment_ref=deployment, tenant_id=tenant,
                           now=now, lease_seconds=600)
    row = await conn.fetchrow(
        """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
               generation => $3, step_key => 'approve', name => $4, timeout_seconds => NULL,
               tenant_id => $5, now_override => $6)""",
        lease.run_id, lease.worker_id, lease.generation, event, tenant, now)
    assert row["outcome"] == "waiting"
    return lease.run_id


async def _state(conn: asyncpg.Connection) -> dict[str, Any]:
    """Everything an action of these pages could change."""
    return {
        "limits": [tuple(r) for r in await conn.fetch(
            "SELECT * FROM zeroth.scope_limits ORDER BY tenant_id, workspace_key, deployment_ref")],
        "keys": [tuple(r) for r in await conn.fetch(
            "SELECT name, max_starts, period_seconds FROM zeroth.rate_limits ORDER BY name")],
        "schedules": [tuple(r) for r in await conn.fetch(
            """SELECT name, paused, next_fire_at, fire_count, last_error FROM zeroth.schedules
                ORDER BY name""")],
        "runs": [tuple(r) for r in await conn.fetch(
            "SELECT run_id, status::text FROM zeroth.runs ORDER BY run_id")],
        "events": await conn.fetchval("SELECT count(*) FROM zeroth.events"),
        "defaults": [tuple(r) for r in await conn.fetch(
            "SELECT deployment_ref, max_attempts, priority, managed_by, version, "
            "retry_base_seconds, retry_max_seconds, lease_seconds "
            "FROM zeroth.deployments ORDER BY deployment_ref")],
        "changes": await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes"),
    }


class TestDeployments:
    async def test_every_scope_is_listed_with_its_counts_and_limits_escaped(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            for _ in range(2):
                await make_run(conn, "pending", deployment_ref=XSS, tenant_id="acme", now=now)
            await make_run(conn, "running", deployment_ref="mail", now=now, lease_seconds=600)
            await make_run(conn, "waiting", deployment_ref="mail", now=now)
            await conn.execute("SELECT zeroth.set_rate_limit(name => 'smtp', max_starts => 10, "
                               "period_seconds => 60)")
            await conn.execute(
                """SELECT zeroth.set_scope_limits(deployment_ref => 'mail', paused => true,
                       max_concurrency => 4, rate_limit => 'smtp')""")
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            page = client.get("/deployments")
            overview = client.get("/").text
            scope = client.get("/deployments/scope?deployment=mail&tenant=default")
            xss_scope = client.get("/deployments/scope", params={"deployment": XSS,
                                                                 "tenant": "acme"})
        assert page.status_code == scope.status_code == xss_scope.status_code == 200
        for response in (page, scope, xss_scope):
            assert not _unescaped_script(response.text)
        assert "&lt;script&gt;" in page.text
        mail = page.text.split('id="scopes"', 1)[1].split(">mail</a>", 1)[1].split("</tr>", 1)[0]
        assert '<span class="st paused">paused</span>' in mail
        assert "smtp:10/60s" in mail
        assert re.search(r'<td class="n">4</td>', mail)
        assert 'href="/deployments/scope?deployment=mail&amp;tenant=default"' in page.text
        assert 'href="/deployments/scope?deployment=mail&amp;tenant=default"' in overview
        assert "smtp" in page.text.split('id="rate-limits"', 1)[1]
        counts = scope.text.split('id="scope-counts"', 1)[1].split("</table>", 1)[0]
        cells = re.findall(r'<td class="n">(\d+)</td>', counts)
        # pending, due, scheduled, running, live leases, expired, waiting, failed, dead
        assert cells == ["0", "0", "0", "1", "1", "0", "1", "0", "0"]
        assert 'id="scope-state">paused' in scope.text
        assert 'action="/actions/' not in page.text + scope.text  # read-only by default

    async def test_pause_resume_and_limits_change_the_scopes_row(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 5, "
                               "period_seconds => 1)")
            url = "/deployments/scope?deployment=mail&tenant=acme&workspace=w1"
            scope = {"deployment": "mail", "tenant": "acme", "workspace": "w1"}

            async def row() -> tuple[Any, ...] | None:
                found = await conn.fetchrow(
                    """SELECT paused, max_concurrency, weight, rate_limit FROM zeroth.scope_limits
                        WHERE tenant_id = 'acme' AND workspace_id = 'w1'
                          AND deployment_ref = 'mail'""")
                return None if found is None else tuple(found)

            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(url)
                assert 'id="pause-scope"' in page.text
                csrf = _csrf(page.text)
                r = client.post("/actions/scope", data={**scope, "op": "pause", "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                assert r.headers["location"].startswith("/deployments/scope?deployment=mail")
                assert await row() == (True, None, 1, None)
                r = client.post("/actions/scope", data={
                    **scope, "op": "limits", "max_concurrency": "3", "weight": "2",
                    "rate_limit": "k", "csrf": csrf}, follow_redirects=False)
                assert r.status_code == 303
                assert await row() == (True, 3, 2, "k")
                r = client.post("/actions/scope", data={**scope, "op": "resume", "csrf": csrf},
                                follow_redirects=False)
                assert await row() == (False, 3, 2, "k")
                # Blank fields: no concurrency limit of its own, weight 1, no rate limit.
                r = client.post("/actions/scope", data={
                    **scope, "op": "limits", "max_concurrency": "", "weight": "",
                    "rate_limit": "", "csrf": csrf}, follow_redirects=False)
                assert r.status_code == 303
                assert await row() == (False, None, 1, None)
                shown = client.get(url).text
                r = client.post("/actions/rate-limit", data={
                    "name": "k", "max_starts": "7", "period_seconds": "2.5", "csrf": csrf},
                    follow_redirects=False)
                assert r.status_code == 303
            assert 'id="scope-state">serving' in shown
            assert tuple(await conn.fetchrow(
                "SELECT max_starts, period_seconds FROM zeroth.rate_limits WHERE name = 'k'")) == (
                7, 2.5)
        finally:
            await conn.close()

    @pytest.mark.parametrize(("path", "form", "status"), [
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "drop"}, 400),
        ("/actions/scope", {"deployment": "", "tenant": "t", "op": "pause"}, 400),
        ("/actions/scope", {"deployment": "x" * 201, "tenant": "t", "op": "pause"}, 400),
        ("/actions/scope", {"deployment": "mail", "op": "pause"}, 400),
        ("/actions/scope", {"deployment": "mail\n", "tenant": "t\x00", "op": "pause"}, 400),
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "limits",
                            "max_concurrency": "abc"}, 400),
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "limits",
                            "max_concurrency": "0"}, 400),
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "limits",
                            "max_concurrency": "10001"}, 400),
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "limits",
                            "weight": "1001"}, 400),
        ("/actions/scope", {"deployment": "mail", "tenant": "t", "op": "limits",
                            "rate_limit": "no-such-key"}, 409),
        ("/actions/rate-limit", {"name": "k", "max_starts": "0", "period_seconds": "1"}, 400),
        ("/actions/rate-limit", {"name": "k", "max_starts": "5", "period_seconds": "nan"}, 400),
        ("/actions/rate-limit", {"name": "k", "max_starts": "5", "period_seconds": "1e9"}, 400),
        ("/actions/rate-limit", {"name": "", "max_starts": "5", "period_seconds": "1"}, 400),
        ("/actions/rate-limit", {"name": "k", "period_seconds": "1"}, 400),
        ("/actions/deployment-defaults", {"deployment": "mail", "tenant": "t",
                                          "max_attempts": "0"}, 400),
        ("/actions/deployment-defaults", {"deployment": "mail", "tenant": "t",
                                          "max_attempts": "1001"}, 400),
        ("/actions/deployment-defaults", {"deployment": "mail", "tenant": "t",
                                          "priority": "high"}, 400),
        ("/actions/deployment-defaults", {"deployment": "", "tenant": "t",
                                          "max_attempts": "3"}, 400),
        *[("/actions/deployment-defaults", {"deployment": "mail", "tenant": "t", **fields}, 400)
          for fields in ({"retry_base_seconds": "-1"}, {"retry_base_seconds": "nan"},
                         {"retry_max_seconds": "2592001"}, {"retry_max_seconds": "inf"},
                         {"lease_seconds": "0"}, {"lease_seconds": "86401"},
                         # a registered lease under a second lapses before its run can start
                         {"lease_seconds": "1e-9"}, {"lease_seconds": "0.5"},
                         {"lease_seconds": "soon"},
                         # merged with the row's (base 5, max 60): refused by the database
                         {"retry_base_seconds": "61"}, {"retry_max_seconds": "4"},
                         {"unset_lease_seconds": "yes please"},
                         {"lease_seconds": "30", "unset_lease_seconds": "on"})],
    ])
    async def test_bad_input_is_refused_clearly_and_changes_nothing(self, database_dsn, path,
                                                                    form, status):
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute(
                "SELECT zeroth.set_scope_limits(deployment_ref => 'mail', tenant_id => 't', "
                "max_concurrency => 2)")
            await conn.execute(
                "SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                "retry_base_seconds => 5, retry_max_seconds => 60, lease_seconds => 120)")
            before = await _state(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get("/deployments").text)
                r = client.post(path, data={**form, "csrf": csrf})
            assert r.status_code == status, r.text
            assert ("bad input" in r.text) if status == 400 else ("ZP008" in r.text)
            assert await _state(conn) == before
        finally:
            await conn.close()

    async def test_a_deployments_defaults_are_shown_and_a_dba_sets_them_audited(
            self, database_dsn):
        """The defaults an application registered (zeroth.deployments) are on each scope page
        of the deployment; the form sets them as a DBA's (managed_by sql), audited, and the next
        run enqueued without values gets them; blank keeps a value."""
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                               "max_attempts => 4, priority => 2)")
            url = "/deployments/scope?deployment=mail&tenant=acme"
            scope = {"deployment": "mail", "tenant": "acme", "workspace": ""}
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(url).text
                shown = page[page.index('id="deployment-defaults"'):]
                assert "<dd>4</dd>" in shown
                assert "<dd>2</dd>" in shown
                assert "the application" in shown
                r = client.post("/actions/deployment-defaults", data={
                    **scope, "max_attempts": "9", "priority": "", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303
                # The message rides signed (zeroth_pg/web/flash.py), not as ?done=.
                assert "flash=" in r.headers["location"]
                assert "done: defaults" in client.get(r.headers["location"]).text
                after = client.get(url).text
            assert "a DBA" in after[after.index('id="deployment-defaults"'):]
            assert tuple(await conn.fetchrow(
                "SELECT max_attempts, priority, managed_by FROM zeroth.deployments "
                "WHERE deployment_ref = 'mail'")) == (9, 2, "sql")
            assert await conn.fetchval(
                "SELECT via FROM zeroth.deployment_changes WHERE deployment_ref = 'mail' "
                "ORDER BY version DESC LIMIT 1") == "set_deployment_defaults"
            run_id = await conn.fetchval(
                "SELECT (zeroth.enqueue_run(deployment_ref => 'mail', payload => '{}', "
                "tenant_id => 'acme')).run_id")
            run = await conn.fetchrow(
                "SELECT max_attempts, priority FROM zeroth.runs WHERE run_id = $1", run_id)
            assert tuple(run) == (9, 2)
        finally:
            await conn.close()

    def test_a_scope_page_without_its_deployment_is_a_clear_400(self, database_dsn):
        with dashboard(create_app(database_dsn)) as client:
            r = client.get("/deployments/scope?tenant=acme")
        assert r.status_code == 400
        assert "deployment is required" in r.text


class TestSchedules:
    async def test_every_schedule_is_listed_with_fire_times_state_and_last_error(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _schedule(conn, XSS)
            await _schedule(conn, "nightly", deployment=XSS)
            await conn.execute(
                """UPDATE zeroth.schedules SET paused = true, last_error = $1,
                          last_error_at = now() WHERE name = 'nightly'""", f"ZP011: {XSS}")
            next_fire = await conn.fetchval(
                "SELECT next_fire_at FROM zeroth.schedules WHERE name = $1", XSS)
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            page = client.get("/schedules")
            filtered = client.get("/schedules?deployment=reports")
        assert page.status_code == 200
        assert not _unescaped_script(page.text)
        assert "&lt;script&gt;" in page.text
        shown = next_fire.strftime("%Y-%m-%d %H:%M:%SZ")
        assert f'title="{next_fire.isoformat()}">{shown}</time>' in page.text
        nightly = page.text.split(">nightly <", 1)[1].split("</tr>", 1)[0]
        assert '<span class="st paused">paused</span>' in nightly
        assert '<details class="failure"><summary>' in nightly  # collapsed
        assert "ZP011: &lt;script&gt;" in nightly
        assert ">nightly <" not in filtered.text
        assert 'action="/actions/' not in page.text

    async def test_pause_resume_and_fire_now(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            created = await _schedule(conn, "hourly", tenant="acme")
            form = {"name": "hourly", "tenant": "acme", "workspace": ""}

            async def paused() -> bool:
                value: bool = await conn.fetchval(
                    "SELECT paused FROM zeroth.schedules WHERE name = 'hourly'")
                return value

            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/schedules").text
                assert 'class="schedule-pause"' in page
                assert 'class="schedule-fire"' in page
                csrf = _csrf(page)
                r = client.post("/actions/schedule", data={**form, "op": "pause", "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                assert await paused() is True
                assert 'class="schedule-resume"' in client.get("/schedules").text
                r = client.post("/actions/schedule", data={**form, "op": "resume",
                                                           "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                assert await paused() is False
                r = client.post("/actions/schedule", data={**form, "op": "fire", "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303
                run_id = r.headers["location"].removeprefix("/runs/").split("?", 1)[0]
            run = await conn.fetchrow(
                """SELECT tenant_id, deployment_ref, status::text AS status, schedule_id
                     FROM zeroth.runs WHERE run_id = $1::uuid""", run_id)
            assert tuple(run) == ("acme", "reports", "pending", created["schedule_id"])
            assert await conn.fetchval(
                "SELECT fire_count FROM zeroth.schedules WHERE name = 'hourly'") == 0
        finally:
            await conn.close()

    async def test_a_fire_now_form_submitted_twice_makes_one_run(self, database_dsn):
        # A double click, or the browser resending the POST: the form's own key (rendered into
        # it) reaches zeroth.fire_schedule_now, which returns the first run the second time.
        conn = await asyncpg.connect(database_dsn)
        try:
            await _schedule(conn, "hourly")
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/schedules").text
                keys = re.findall(r'name="key" value="([^"]+)"', page)
                assert len(keys) == 1
                assert len(keys[0]) >= 32
                assert keys != re.findall(r'name="key" value="([^"]+)"',
                                          client.get("/schedules").text)  # one per form
                form = {"name": "hourly", "tenant": "default", "workspace": "", "op": "fire",
                        "key": keys[0], "csrf": _csrf(page)}
                first = client.post("/actions/schedule", data=form, follow_redirects=False)
                second = client.post("/actions/schedule", data=form, follow_redirects=False)
                other = client.post("/actions/schedule", data={**form, "key": "another-form"},
                                    follow_redirects=False)
                bad = client.post("/actions/schedule", data={**form, "key": "k" * 201})
            assert first.status_code == second.status_code == 303
            assert first.headers["location"] == second.headers["location"]
            assert other.headers["location"] != first.headers["location"]
            assert bad.status_code == 400
            assert "key is longer than" in bad.text
            assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 2
        finally:
            await conn.close()

    @pytest.mark.parametrize(("form", "status", "says"), [
        ({"name": "hourly", "tenant": "default", "op": "delete"}, 400, "op must be"),
        ({"name": "", "tenant": "default", "op": "pause"}, 400, "name is required"),
        ({"name": "hourly", "op": "fire"}, 400, "tenant is required"),
        ({"name": "x" * 201, "tenant": "default", "op": "pause"}, 400, "longer than"),
        ({"name": "missing", "tenant": "default", "op": "fire"}, 409, "ZP009"),
        ({"name": "hourly", "tenant": "other", "op": "pause"}, 409, "ZP009"),
    ])
    async def test_bad_input_is_refused_clearly_and_changes_nothing(self, database_dsn, form,
                                                                    status, says):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _schedule(conn, "hourly")
            before = await _state(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get("/schedules").text)
                r = client.post("/actions/schedule", data={**form, "csrf": csrf})
            assert r.status_code == status
            assert says in r.text
            assert await _state(conn) == before
        finally:
            await conn.close()


class TestEvents:
    async def test_waiting_runs_show_what_they_wait_for_and_an_emit_wakes_them(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            on_event = await _wait_for_event(conn, XSS)
            now = await _now(conn)
            parent = await make_run(conn, "running", deployment_ref="plan", now=now,
                                    lease_seconds=600)
            child = await start_child(conn, parent.run_id, parent.generation, "research",
                                      now=now)
            outcome, _ = await wait_children(conn, parent.run_id, parent.generation, "join",
                                             [child["child_run_id"]], now=now)
            assert outcome == "waiting"
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/events").text
                csrf = _csrf(page)
                r = client.post("/actions/emit-event", data={
                    "name": XSS, "tenant": "default", "workspace": "",
                    "payload": '{"approved": true}', "csrf": csrf}, follow_redirects=False)
                assert r.status_code == 303
                after = client.get(r.headers["location"]).text
                again = client.post("/actions/emit-event", data={
                    "name": XSS, "tenant": "default", "payload": "", "csrf": csrf}).text
            status = await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                         on_event)
            payload = await conn.fetchval("SELECT payload::text FROM zeroth.events")
        finally:
            await conn.close()
        assert not _unescaped_script(page + after + again)
        row = page.split(f'href="/runs/{on_event}?', 1)[1].split("</tr>", 1)[0]
        assert "event <span class=\"mono\">&lt;script&gt;" in row
        assert 'class="emit-one"' in row
        children = page.split(f'href="/runs/{parent.run_id}?', 1)[1].split("</tr>", 1)[0]
        assert "children" in children
        assert "1 of 1 still open; step join" in children
        assert status == "pending"
        assert json.loads(payload) == {"approved": True}
        assert "runs woken: 1" in after
        assert "already emitted" in again  # first write wins

    @pytest.mark.parametrize(("form", "says"), [
        ({"name": "", "payload": "1"}, "name is required"),
        ({"name": "go", "payload": "{not json"}, "not JSON"),
        ({"name": "go", "payload": "NaN"}, "not JSON"),
        ({"name": "go", "payload": "1" * 40_000}, "larger than"),
        ({"name": "go", "workspace": "w"}, "a workspace needs a tenant"),
        ({"name": "go\x07"}, "control character"),
    ])
    async def test_bad_input_is_refused_clearly_and_emits_nothing(self, database_dsn, form,
                                                                  says):
        conn = await asyncpg.connect(database_dsn)
        try:
            waiting = await _wait_for_event(conn, "go")
            before = await _state(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get("/events").text)
                r = client.post("/actions/emit-event", data={**form, "csrf": csrf})
            assert r.status_code == 400
            assert says in r.text
            assert await _state(conn) == before
            assert await conn.fetchval(
                "SELECT status::text FROM zeroth.runs WHERE run_id = $1", waiting) == "waiting"
        finally:
            await conn.close()


class TestWorkers:
    async def test_live_expired_idle_and_gone_workers_from_the_database(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        idle = await asyncpg.connect(
            database_dsn, server_settings={"application_name": "zeroth-worker:w-idle"})
        try:
            now = await _now(conn)
            await make_run(conn, "running", worker_id="w-live", now=now, lease_seconds=600)
            await make_run(conn, "running", worker_id=XSS, now=now, lease_seconds=0.001)
            await make_run(conn, "completed", worker_id="w-gone", now=now)
            with dashboard(create_app(database_dsn)) as client:
                page = client.get("/workers").text
        finally:
            await idle.close()
            await conn.close()
        assert not _unescaped_script(page)
        states = {worker: state for state, worker in re.findall(
            r'<tr class="worker-([a-z-]+)"><td class="mono">([^<]+)</td>', page)}
        assert states == {"w-live": "live", "w-idle": "idle", "w-gone": "gone",
                          "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;": "expired"}
        assert 'class="bad-t lease-expired"' in page

    async def test_a_tenant_reader_sees_its_tenants_workers_and_no_session(self, database_dsn,
                                                                          pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        other = await asyncpg.connect(
            database_dsn, server_settings={"application_name": "zeroth-worker:initech-idle"})
        try:
            now = await _now(conn)
            await make_run(conn, "running", worker_id="acme-w", tenant_id="acme", now=now,
                           lease_seconds=600)
            await make_run(conn, "completed", worker_id="initech-w", tenant_id="initech",
                           now=now)
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                with dashboard(create_app(dsn_as(database_dsn, name, password))) as client:
                    page = client.get("/workers").text
        finally:
            await other.close()
            await conn.close()
        assert '<tr class="worker-live"><td class="mono">acme-w</td>' in page
        assert "initech" not in page  # neither its finished attempts nor its session


class TestRunTimeline:
    async def test_a_run_reads_as_a_timeline_with_collapsed_readable_tracebacks(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            run = await make_run(conn, "running", deployment_ref="plan", now=now,
                                 lease_seconds=600)
            trace = 'Traceback (most recent call last):\n  File "h.py", line 3\nKeyError: <b>'
            assert await conn.fetchval(
                """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                       error => jsonb_build_object('type', 'KeyError', 'message', 'k',
                                                   'traceback', $4::text),
                       retryable => true, retry_base_seconds => 0, now_override => $5)""",
                run.run_id, run.worker_id, run.generation, trace, now) == "retry_scheduled"
            second = await conn.fetchrow(
                """SELECT run_id, lease_generation FROM zeroth_test.claim_and_start(
                       deployment_ref => 'plan', worker_id => 'w-2', batch_size => 1,
                       lease_seconds => 600, now_override => $1) WHERE run_id = $2""",
                now + timedelta(seconds=1), run.run_id)
            generation = second["lease_generation"]
            await conn.execute(
                """SELECT zeroth_test.record_step(run_id => $1, worker_id => 'w-2',
                       generation => $2, step_key => 'fetch', result => '{"rows": 3}',
                       now_override => $3)""", run.run_id, generation, now + timedelta(seconds=2))
            await conn.execute(
                """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => 'w-2',
                       generation => $2, data => '{"at": "fetched"}', now_override => $3)""",
                run.run_id, generation, now + timedelta(seconds=3))
            child = await start_child(conn, run.run_id, generation, "summarise", worker="w-2",
                                      now=now + timedelta(seconds=4))
            with dashboard(create_app(database_dsn)) as client:
                page = client.get(f"/runs/{run.run_id}").text
                child_page = client.get(f"/runs/{child['child_run_id']}").text
        finally:
            await conn.close()
        timeline = page.split('<ol class="timeline" id="timeline">', 1)[1].split("</ol>", 1)[0]
        kinds = re.findall(r'<li class="tl-([a-z-]+)">', timeline)
        assert kinds == ["created", "claimed", "ended", "claimed", "step", "checkpoint", "child"]
        ended = timeline.split('<li class="tl-ended">', 1)[1].split("</li>", 1)[0]
        assert "failed (will retry)" in ended
        assert '<details class="failure"><summary>KeyError: k</summary>' in ended  # collapsed
        assert 'File &#34;h.py&#34;, line 3\nKeyError: &lt;b&gt;' in ended
        assert f'href="/runs/{child["child_run_id"]}?' in timeline
        child_timeline = child_page.split('id="timeline">', 1)[1].split("</ol>", 1)[0]
        assert f'started as a child of <a class="mono" href="/runs/{run.run_id}?' in (
            child_timeline)
        # One short timestamp format, the full value in the title.
        stamps = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', page)
        assert stamps
        assert all(full == title and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", shown)
                   for full, title, shown in stamps)
        # No long timestamp left outside the title attributes (the attempt table included).
        bare = re.sub(r'(datetime|title)="[^"]*"', "", page)
        assert not re.search(r"\d\d:\d\d:\d\d\.\d+", bare)


async def _seed(conn: asyncpg.Connection) -> None:
    await _schedule(conn, "hourly", tenant="acme")
    await _wait_for_event(conn, "go", tenant="acme")
    await conn.execute("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 5, "
                       "period_seconds => 1)")


class TestDeploymentPolicy:
    async def test_the_retry_policy_and_lease_are_shown_set_and_unset_audited(
            self, database_dsn):
        """The scope page shows a deployment's registered retry policy and lease (or that they
        are not set); the form sets them through zeroth.set_deployment_defaults (audited), and
        its checkboxes set them back to not set."""
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                               "retry_base_seconds => 5, retry_max_seconds => 60)")
            url = "/deployments/scope?deployment=mail&tenant=acme"
            scope = {"deployment": "mail", "tenant": "acme", "workspace": ""}
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(url).text
                shown = page[page.index('id="deployment-defaults"'):]
                assert "5 s, doubled per attempt, at most 60 s" in shown
                assert "<dt>lease</dt><dd><span class=\"muted\">not set</span>" in shown
                assert 'name="retry_base_seconds" inputmode="decimal" value="5"' in shown
                r = client.post("/actions/deployment-defaults", data={
                    **scope, "lease_seconds": "900", "retry_max_seconds": "120",
                    "csrf": _csrf(page)}, follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(url).text
                assert "<dt>lease</dt><dd>900 s</dd>" in page
                r = client.post("/actions/deployment-defaults", data={
                    **scope, "unset_retry_base_seconds": "on",
                    "unset_retry_max_seconds": "on", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(url).text
                assert "<dt>retry backoff</dt><dd><span class=\"muted\">not set</span>" in page
            assert tuple(await conn.fetchrow(
                "SELECT retry_base_seconds, retry_max_seconds, lease_seconds, managed_by "
                "FROM zeroth.deployments WHERE deployment_ref = 'mail'")) == (
                    None, None, 900, "sql")
            audit = await conn.fetch(
                "SELECT version, via, new_values::text AS new FROM zeroth.deployment_changes "
                "WHERE deployment_ref = 'mail' ORDER BY version")
            assert [(r["version"], r["via"]) for r in audit] == [
                (1, "register_deployment"), (2, "set_deployment_defaults"),
                (3, "set_deployment_defaults")]
            assert json.loads(audit[1]["new"])["retry_max_seconds"] == 120
        finally:
            await conn.close()


    async def test_the_timeouts_are_shown_or_said_not_set(self, database_dsn):
        """The scope page shows a deployment's attempt and run timeouts (issue 34 item 2)."""
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                               "attempt_timeout_seconds => 900)")
            with dashboard(create_app(database_dsn)) as client:
                page = client.get("/deployments/scope?deployment=mail&tenant=acme").text
            shown = page[page.index('id="deployment-defaults"'):]
            assert "<dt>attempt timeout</dt><dd>900 s from each claim" in shown
            assert "<dt>run timeout</dt><dd><span class=\"muted\">not set</span>" in shown
        finally:
            await conn.close()


class TestATenantReader:
    # Its actions are refused: test_web_action_guards.py, for every action of the dashboard.
    async def test_a_tenant_reader_sees_only_its_tenant(self, database_dsn, pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _seed(conn)
            await _schedule(conn, "initech-nightly", deployment="initech-reports",
                            tenant="initech")
            await _wait_for_event(conn, "initech-go", tenant="initech",
                                  deployment="initech-approvals")
            await conn.execute(
                "SELECT zeroth.set_scope_limits(deployment_ref => 'initech-mail', "
                "tenant_id => 'initech', paused => true)")
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                reader = dsn_as(database_dsn, name, password)
                with dashboard(create_app(reader, enable_actions=True)) as client:
                    pages = {path: client.get(path) for path in (
                        "/deployments", "/schedules", "/events",
                        "/deployments/scope?deployment=initech-mail&tenant=initech")}
            foreign = "/deployments/scope?deployment=initech-mail&tenant=initech"
            for path, response in pages.items():
                assert response.status_code == 200, path
                if path != foreign:  # that page names what it was asked for, and no more
                    assert "initech" not in response.text.split("<main>", 1)[1], path
            assert 'id="scope-state">serving' in pages[foreign].text  # its pause is not seen
            assert "hourly" in pages["/schedules"].text
            assert "approvals" in pages["/events"].text
            assert 'id="scope-counts"' not in pages[foreign].text
        finally:
            await conn.close()


class TestBadQueries:
    @pytest.mark.parametrize("path", [
        "/deployments/scope?deployment=mail",
        "/deployments/scope?deployment=" + "x" * 201 + "&tenant=t",
        "/deployments/scope?deployment=mail&tenant=t&workspace=%07",
        "/schedules?deployment=" + "x" * 201,
        "/schedules?tenant=%00",
        "/events?deployment=" + "x" * 201,
    ])
    def test_a_bad_filter_is_a_clear_400(self, database_dsn, path):
        with dashboard(create_app(database_dsn)) as client:
            r = client.get(path)
        assert r.status_code == 400
        assert "bad input" in r.text


def _walk(client: Any, url: str, link: str, row: str) -> list[list[str]]:
    """The pages met following the ``link`` (next / prev) links from ``url``: each page's
    ``row`` matches, in order."""
    pages: list[list[str]] = []
    next_url: str | None = url
    while next_url:
        page = client.get(next_url)
        assert page.status_code == 200, page.text[:300]
        pages.append(re.findall(row, page.text))
        found = re.search(rf'id="{link}" href="([^"]+)"', page.text)
        next_url = found.group(1).replace("&amp;", "&") if found else None
        assert len(pages) < 20, "the links loop"
    return pages


def _last_older(client: Any, url: str) -> str:
    while True:
        found = re.search(r'id="next" href="([^"]+)"', client.get(url).text)
        if not found:
            return url
        url = found.group(1).replace("&amp;", "&")


_ZERO = "00000000-0000-0000-0000-000000000000"
_BAD_CURSORS = [
    "after_at=yesterday&after_id=" + _ZERO,
    "after_at=2026-01-01T00:00:00%2B00:00",  # half a cursor
    "after_at=2026-01-01T00:00:00&after_id=" + _ZERO,  # no time zone
    "after_at=2026-01-01T00:00:00%2B00:00&after_id=not-a-uuid",
    f"after_at=2026-01-01T00:00:00%2B00:00&after_id={_ZERO}"
    f"&before_at=2026-01-01T00:00:00%2B00:00&before_id={_ZERO}",  # both ways at once
    f"after_at=0001-01-01T00:00:00%2B05:00&after_id={_ZERO}",  # out of range
]


class TestPagingSchedulesAndEvents:
    """issue 31: the schedules and events pages page by cursor both ways, as the runs page does,
    with a bounded total; a bad cursor is a clear 400 that changes nothing."""

    async def test_the_schedules_page_pages_both_ways(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.pages_schedules.PAGE_SIZE", 3)
        conn = await asyncpg.connect(database_dsn)
        try:
            for i in range(8):
                await _schedule(conn, f"sched-{i}", tenant="acme" if i < 7 else None)
        finally:
            await conn.close()
        row = r"<tr><td>(sched-\d+) <span"
        with dashboard(create_app(database_dsn)) as client:
            first = client.get("/schedules?tenant=acme").text
            forward = _walk(client, "/schedules?tenant=acme", "next", row)
            back = _walk(client, _last_older(client, "/schedules?tenant=acme"), "prev", row)
        assert '<span id="total"' in first
        assert re.search(r'id="total"[^>]*>7<', first)
        assert 'id="prev"' not in first
        # Newest first, 3 a page, every schedule of the tenant once (not the other tenant's).
        assert forward == [["sched-6", "sched-5", "sched-4"], ["sched-3", "sched-2", "sched-1"],
                           ["sched-0"]]
        assert back == list(reversed(forward))

    async def test_the_events_page_pages_both_ways(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.pages_events.PAGE_SIZE", 3)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            waiting = []
            for i in range(7):
                lease = await make_run(conn, "running", deployment_ref="approvals",
                                       now=now + timedelta(seconds=i), lease_seconds=600)
                assert await conn.fetchval(
                    """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1,
                           worker_id => $2, generation => $3, step_key => 'approve',
                           name => $4, timeout_seconds => NULL, now_override => $5)""",
                    lease.run_id, lease.worker_id, lease.generation, f"ev-{i}",
                    now + timedelta(seconds=i)) == "waiting"
                waiting.append(f"ev-{i}")
            await make_run(conn, "waiting", deployment_ref="other", now=now)
        finally:
            await conn.close()
        row = r'event <span class="mono">(ev-\d+)</span>'
        with dashboard(create_app(database_dsn)) as client:
            first = client.get("/events?deployment=approvals").text
            forward = _walk(client, "/events?deployment=approvals", "next", row)
            back = _walk(client, _last_older(client, "/events?deployment=approvals"), "prev",
                         row)
        assert re.search(r'id="total"[^>]*>7<', first)
        # Longest waiting first, 3 a page, each waiting run once.
        assert forward == [waiting[0:3], waiting[3:6], waiting[6:7]]
        assert back == list(reversed(forward))

    @pytest.mark.parametrize("path", ["/schedules", "/events"])
    @pytest.mark.parametrize("cursor", _BAD_CURSORS)
    async def test_a_bad_cursor_is_a_clear_400_and_changes_nothing(self, database_dsn, path,
                                                                   cursor):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _schedule(conn, "hourly")
            await _wait_for_event(conn, "approve-1")
            before = await _state(conn)
            with dashboard(create_app(database_dsn, enable_actions=True),
                           raise_server_exceptions=False) as client:
                answer = client.get(f"{path}?{cursor}")
            assert answer.status_code == 400, answer.text[:300]
            assert "bad input" in answer.text
            assert await _state(conn) == before
        finally:
            await conn.close()
