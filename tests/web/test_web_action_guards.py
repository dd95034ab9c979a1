"""Every action of the dashboard keeps the same guards: one module, the same cases over each.

Each POST route of ``create_app`` has one row in ACTIONS (a form that would work), and
``test_every_action_of_the_dashboard_is_in_the_module`` fails when a route has none, so a new
action gets the whole set by adding that row. For each action:

* read-only (the default): refused (403, "disabled"), and the pages show no action form;
* actions enabled: a POST without the CSRF token, with a forged one, or with the token of another
  browser's session is refused (403, CSRF); a page of another site posting the operator's own
  form with its cookie and token is refused on its Origin (403); a DNS-rebinding page, under its
  own Host name, gets 421; none of these changes any row;
* the same form with the session's token, from the dashboard's own page, is done and changes the
  database (so the refusals above are not vacuous);
* a zeroth_reader's dashboard with actions enabled: every action is refused by the database
  (403, 42501) and changes nothing.

The cases each page's own module used to repeat for its actions (test_web_operator_pages,
test_web_timeouts_and_version_policy, test_web_pages, test_web_flows) are here; those modules keep
what is particular to their pages (bad input, what a done action shows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from helpers import dashboard, make_run
from roles import dsn_as, login_role
from starlette.routing import Route
from test_web_operator_pages import _schedule, _wait_for_event
from test_web_pages import FOREIGN_HOST, FOREIGN_ORIGIN, _csrf, _dead_letter, _now

from zeroth_pg.web import create_app

TENANT = "acme"
SCOPE_URL = f"/deployments/scope?deployment=mail&tenant={TENANT}"
SCOPE = {"deployment": "mail", "tenant": TENANT, "workspace": ""}


@dataclass(frozen=True)
class Action:
    """One action of the dashboard: its route, a form that would work on the seeded database
    (``form(seeded)``), and the status it answers when done."""

    name: str
    path: str
    form: Callable[[dict[str, Any]], dict[str, str]]
    done: int = 303

    def __str__(self) -> str:
        return self.name


ACTIONS = [
    Action("cancel", "/actions/cancel", lambda s: {"run_id": str(s["pending"])}),
    Action("redrive", "/actions/redrive", lambda s: {"run_id": str(s["dead"])}),
    Action("redrive-matching", "/actions/redrive-matching",
           lambda s: {"deployment": "dead", "tenant": TENANT}),
    # The bulk action answers with its result page, not a redirect.
    Action("bulk", "/actions/bulk", lambda s: {"op": "cancel", "ids": str(s["pending"])},
           done=200),
    Action("scope", "/actions/scope",
           lambda s: {"deployment": "mail", "tenant": TENANT, "op": "pause"}),
    Action("rate-limit", "/actions/rate-limit",
           lambda s: {"name": "k", "max_starts": "9", "period_seconds": "1"}),
    Action("schedule", "/actions/schedule",
           lambda s: {"name": "hourly", "tenant": TENANT, "op": "fire"}),
    Action("emit-event", "/actions/emit-event", lambda s: {"name": "go", "tenant": TENANT}),
    Action("deployment-defaults", "/actions/deployment-defaults",
           lambda s: {"deployment": "mail", "tenant": TENANT, "max_attempts": "7"}),
    Action("deployment-timeouts", "/actions/deployment-defaults",
           lambda s: {**SCOPE, "attempt_timeout_seconds": "900", "run_timeout_seconds": "7200"}),
    Action("version-policy", "/actions/version-policy",
           lambda s: {**SCOPE, "version_policy": "compatible", "compatible_versions": "v1, v2"}),
]


async def _seed(conn: asyncpg.Connection) -> dict[str, Any]:
    """What every action can act on, in tenant acme (a tenant reader sees it, so its refusals
    are the database's, not a run it cannot see): a pending run and a dead letter, a schedule,
    a run waiting on an event, a rate limit key, and deployment 'mail' registered."""
    now = await _now(conn)
    pending = await make_run(conn, "pending", deployment_ref="mail", tenant_id=TENANT, now=now)
    dead = await _dead_letter(conn, "dead", now, tenant_id=TENANT)
    await _schedule(conn, "hourly", tenant=TENANT)
    await _wait_for_event(conn, "go", tenant=TENANT)
    await conn.execute("SELECT zeroth.set_rate_limit(name => 'k', max_starts => 5, "
                       "period_seconds => 1)")
    await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                       "attempt_timeout_seconds => 60)")
    return {"pending": pending.run_id, "dead": dead}


async def _state(conn: asyncpg.Connection) -> dict[str, Any]:
    """Everything an action of the dashboard could change."""
    async def rows(query: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await conn.fetch(query)]

    return {
        "runs": await rows(
            "SELECT run_id, status::text, cancel_requested_at, dead_lettered_at, attempts "
            "FROM zeroth.runs ORDER BY run_id"),
        "limits": await rows(
            "SELECT * FROM zeroth.scope_limits ORDER BY tenant_id, workspace_key, deployment_ref"),
        "keys": await rows(
            "SELECT name, max_starts, period_seconds FROM zeroth.rate_limits ORDER BY name"),
        "schedules": await rows(
            "SELECT name, paused, next_fire_at, fire_count, last_error FROM zeroth.schedules "
            "ORDER BY name"),
        "events": await conn.fetchval("SELECT count(*) FROM zeroth.events"),
        "deployments": await rows(
            "SELECT deployment_ref, max_attempts, priority, managed_by, version, "
            "retry_base_seconds, retry_max_seconds, lease_seconds, attempt_timeout_seconds, "
            "run_timeout_seconds, version_policy, compatible_versions "
            "FROM zeroth.deployments ORDER BY deployment_ref"),
        "changes": await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes"),
        "version_changes": await conn.fetchval(
            "SELECT count(*) FROM zeroth.code_version_changes"),
    }


def test_every_action_of_the_dashboard_is_in_the_module(database_dsn):
    posts = {route.path for route in create_app(database_dsn, enable_actions=True).routes
             if isinstance(route, Route) and "POST" in (route.methods or ())}
    assert posts == {action.path for action in ACTIONS}


@pytest.mark.parametrize("action", ACTIONS, ids=str)
async def test_refused_read_only_forged_or_foreign_and_done_with_the_sessions_token(
        database_dsn, action):
    conn = await asyncpg.connect(database_dsn)
    try:
        form = action.form(await _seed(conn))
        before = await _state(conn)
        with dashboard(create_app(database_dsn)) as client:
            pages = [client.get(path).text for path in ("/", SCOPE_URL, "/events")]
            r = client.post(action.path, data={**form, "csrf": "x"})
            assert r.status_code == 403
            assert "disabled" in r.text
        for page in pages:  # read-only: no action form is shown
            assert 'action="/actions/' not in page
            assert 'id="version-policy-form"' not in page
            assert 'id="deployment-defaults-form"' not in page
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            csrf = _csrf(client.get(SCOPE_URL).text)
            # A token from another session of this very dashboard (another browser's cookie,
            # the same server: a token of another dashboard process differs by its secret
            # alone, whether or not the token is bound to the session).
            mine = list(client.cookies.jar)
            client.cookies.clear()
            stolen = _csrf(client.get(SCOPE_URL).text)
            client.cookies.clear()
            for cookie in mine:
                client.cookies.jar.set_cookie(cookie)
            assert stolen != csrf
            for data in (form, {**form, "csrf": "0" * 64}, {**form, "csrf": stolen}):
                r = client.post(action.path, data=data)
                assert r.status_code == 403
                assert "CSRF" in r.text
            # A page of another site posting the operator's own form (its cookie rides).
            r = client.post(action.path, data={**form, "csrf": csrf},
                            headers={"Origin": "http://evil.example"})
            assert r.status_code == 403
            # DNS rebinding: the attacker's name resolving to the dashboard.
            r = client.post(action.path, data={**form, "csrf": csrf},
                            headers={"Host": FOREIGN_HOST, "Origin": FOREIGN_ORIGIN})
            assert r.status_code == 421
            assert "mail" not in r.text
            assert await _state(conn) == before
            # The same form with the session's token, from the dashboard's own page: done.
            r = client.post(action.path, data={**form, "csrf": csrf}, follow_redirects=False)
        assert r.status_code == action.done, r.text
        assert await _state(conn) != before
    finally:
        await conn.close()


async def test_a_readers_dashboard_is_refused_every_action_by_the_database(database_dsn,
                                                                           pg_server_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        seeded = await _seed(conn)
        before = await _state(conn)
        with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
            await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = '{TENANT}'")
            with dashboard(create_app(dsn_as(database_dsn, name, password),
                                      enable_actions=True)) as client:
                csrf = _csrf(client.get(SCOPE_URL).text)
                refused = {action.name: client.post(action.path, data={
                    **action.form(seeded), "csrf": csrf}) for action in ACTIONS}
        for action, response in refused.items():
            assert response.status_code == 403, (action, response.text)
            assert "42501" in response.text, action
        assert await _state(conn) == before
    finally:
        await conn.close()
