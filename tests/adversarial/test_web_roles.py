"""zeroth-pg web as the roles it must keep in their place, on the database as shipped (no test
clock): a LOGIN role with no grant gets an error page and no data on every page; a zeroth_reader
DSN with actions enabled is refused by the database and nothing changes (bulk actions too); a
reader with zeroth.tenant_id set sees only its tenant on every page; HTML/JS in every value is
escaped on every page (run detail with its steps and event waits included); a missing or wrong
CSRF token is refused on every action; the token guards every route."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import asyncpg
import psycopg
import pytest
from helpers import dashboard
from psycopg import sql as pgsql
from roles import dsn_as, login_role

from zeroth_pg.testing import libpq_dsn
from zeroth_pg.web import create_app

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
ACTIONS = ("/actions/redrive", "/actions/redrive-matching", "/actions/cancel", "/actions/bulk",
           "/actions/scope", "/actions/rate-limit", "/actions/schedule", "/actions/emit-event")


async def seed(admin: asyncpg.Connection, tenant: str, *, worker_id: str = "w1"
               ) -> dict[str, Any]:
    """In ``tenant``: a pending run, a running run with a step and one waiting on an event, and
    a dead letter, every text an attacker could choose set to XSS."""
    async def enqueue(**kwargs: Any) -> Any:
        return await admin.fetchval(
            """SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2,
                   payload => $3::text::jsonb, idempotency_key => $4, max_attempts => $5,
                   thread_id => $6)""",
            kwargs.get("deployment", XSS), tenant, json.dumps({"html": XSS}),
            kwargs.get("key"), kwargs.get("max_attempts", 3), kwargs.get("thread"))

    async def start(run_id: Any, deployment: str) -> int:
        (row,) = await admin.fetch(
            """SELECT run_id, lease_generation FROM zeroth.claim_and_start(
                   deployment_ref => $1, worker_id => $2, tenant_id => $3, lease_seconds => 600)
                WHERE run_id IS NOT NULL""", deployment, worker_id, tenant)
        assert row["run_id"] == run_id
        return int(row["lease_generation"])

    stepped = await enqueue(deployment="steps", key=XSS, thread=XSS)
    generation = await start(stepped, "steps")
    assert await admin.fetchval(
        """SELECT recorded FROM zeroth.record_step(run_id => $1, worker_id => $2,
               generation => $3, step_key => $4, result => $5::text::jsonb, tenant_id => $6)""",
        stepped, worker_id, generation, XSS, json.dumps(XSS), tenant)
    waiting = await enqueue(deployment="waits")
    generation = await start(waiting, "waits")
    assert await admin.fetchval(
        """SELECT outcome FROM zeroth.wait_for_event(run_id => $1, worker_id => $2,
               generation => $3, step_key => $4, name => $5, tenant_id => $6)""",
        waiting, worker_id, generation, XSS, "ev" + XSS[:40], tenant) == "waiting"
    dead = await enqueue(deployment="dead", max_attempts=1)
    generation = await start(dead, "dead")
    assert await admin.fetchval(
        """SELECT zeroth.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => $4::text::jsonb, retryable => true, tenant_id => $5)""",
        dead, worker_id, generation, json.dumps({"message": XSS}), tenant) == "dead_lettered"
    pending = await enqueue()
    # A schedule named XSS of deployment XSS, with a last error, and the scope's limits row.
    await admin.execute(
        """SELECT zeroth.create_schedule(name => $1, deployment_ref => $1, tenant_id => $2,
               interval_seconds => 3600)""", XSS, tenant)
    await admin.execute("UPDATE zeroth.schedules SET last_error = $1 WHERE tenant_id = $2",
                        XSS, tenant)
    await admin.execute(
        """SELECT zeroth.set_scope_limits(deployment_ref => $1, tenant_id => $2,
               max_concurrency => 5)""", XSS, tenant)
    return {"pending": pending, "stepped": stepped, "waiting": waiting, "dead": dead}


def pages(runs: dict[str, Any]) -> list[str]:
    return ["/", "/overview.json", "/runs", "/runs?status=failed", "/dead-letters", "/workers",
            "/deployments", "/deployments/scope?deployment=waits&tenant=acme", "/schedules",
            "/events", "/runs?search=" + XSS, "/bulk?op=cancel", "/bulk?op=redrive&source=dead",
            "/bulk?op=redrive", *(f"/runs/{run_id}" for run_id in runs.values())]


async def snapshot(admin: asyncpg.Connection) -> list[tuple[Any, ...]]:
    """What any action could change: the runs, the scopes' limits, the rate limits, the
    schedules and the events."""
    return [tuple(r) for r in await admin.fetch(
        "SELECT r.run_id, r.status, r.cancel_requested_at, r.dead_lettered_at, r.attempts "
        "FROM zeroth.runs r ORDER BY r.run_id")] + [tuple(r) for r in await admin.fetch(
            """SELECT 'limits', tenant_id, deployment_ref, paused, max_concurrency, weight,
                      rate_limit FROM zeroth.scope_limits
               UNION ALL SELECT 'key', name, NULL, NULL, max_starts, NULL, NULL
                 FROM zeroth.rate_limits
               UNION ALL SELECT 'schedule', tenant_id, name, paused, fire_count::int, NULL,
                                next_fire_at::text FROM zeroth.schedules
               UNION ALL SELECT 'event', tenant_id, name, NULL, NULL, NULL, NULL
                 FROM zeroth.events
               ORDER BY 1, 2, 3""")]


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


@pytest.fixture
def as_role(pg_server_dsn: str, database_dsn: str) -> Any:
    """``with as_role("zeroth_reader", tenant="acme") as dsn``: a new LOGIN role's DSN, with
    zeroth.tenant_id set for the role when ``tenant`` is given."""
    @contextlib.contextmanager
    def make(member_of: str | None, tenant: str | None = None) -> Iterator[str]:
        with login_role(pg_server_dsn, member_of) as (name, password):
            if tenant is not None:
                with psycopg.connect(libpq_dsn(database_dsn), autocommit=True) as c:
                    c.execute(pgsql.SQL("ALTER ROLE {} SET zeroth.tenant_id = {}").format(
                        pgsql.Identifier(name), pgsql.Literal(tenant)))
            yield dsn_as(database_dsn, name, password)
    return make


class TestNoGrant:
    async def test_every_page_is_an_error_page_with_no_data(self, admin, as_role):
        runs = await seed(admin, "acme")
        with as_role(None) as dsn, dashboard(create_app(dsn, enable_actions=True)) as client:
            answers = {path: client.get(path) for path in pages(runs)}
        for path, response in answers.items():
            assert response.status_code == 403, (path, response.status_code)
            assert "42501" in response.text, path
            assert "zeroth_reader" in response.text, path
            assert "Traceback" not in response.text, path
            for run_id in runs.values():
                assert str(run_id)[:12] not in response.text.replace(
                    path.rsplit("/", 1)[-1], ""), path
            assert "acme" not in response.text, path


class TestReader:
    async def test_actions_are_refused_by_the_database_and_change_nothing(self, admin, as_role):
        runs = await seed(admin, "acme")
        before = await snapshot(admin)
        with as_role("zeroth_reader", tenant="acme") as dsn, \
                dashboard(create_app(dsn, enable_actions=True)) as client:
            token = csrf(client.get(f"/runs/{runs['dead']}").text)
            answers = [
                client.post("/actions/redrive", data={"run_id": str(runs["dead"]), "csrf": token}),
                client.post("/actions/redrive-matching", data={"deployment": "dead",
                                                               "csrf": token}),
                client.post("/actions/cancel", data={"run_id": str(runs["pending"]),
                                                     "csrf": token}),
                client.post("/actions/cancel", data={"run_id": str(runs["stepped"]),
                                                     "csrf": token}),
                client.post("/actions/bulk", data={"op": "cancel", "csrf": token, "ids": " ".join(
                    str(runs[k]) for k in ("pending", "stepped", "waiting"))}),
                client.post("/actions/bulk", data={"op": "redrive", "csrf": token,
                                                   "ids": str(runs["dead"])}),
                client.post("/actions/scope", data={"deployment": "waits", "tenant": "acme",
                                                    "op": "pause", "csrf": token}),
                client.post("/actions/rate-limit", data={"name": "k", "max_starts": "5",
                                                         "period_seconds": "1", "csrf": token}),
                *(client.post("/actions/schedule", data={"name": XSS, "tenant": "acme",
                                                         "op": op, "csrf": token})
                  for op in ("pause", "resume", "fire")),
                client.post("/actions/emit-event", data={"name": "ev" + XSS[:40],
                                                         "tenant": "acme", "csrf": token}),
            ]
        for response in answers:
            assert response.status_code == 403, response.text
            assert "42501" in response.text
            assert "Traceback" not in response.text
        assert await snapshot(admin) == before

    async def test_a_tenant_reader_sees_only_its_tenant_on_every_page(self, admin, as_role):
        mine = await seed(admin, "acme", worker_id="acme-worker")
        theirs = await seed(admin, "initech", worker_id="initech-worker")
        # Actions enabled, so the bulk confirmations (reads) are served too.
        with as_role("zeroth_reader", tenant="acme") as dsn, \
                dashboard(create_app(dsn, enable_actions=True)) as client:
            answers = {path: client.get(path) for path in pages(mine)}
            other = {path: client.get(path) for path in pages(theirs)
                     if path.startswith("/runs/")}
            filtered = client.get("/runs?tenant=initech").text
        for path, response in answers.items():
            assert response.status_code == 200, (path, response.text)
            assert "initech" not in response.text, path
            for run_id in theirs.values():
                assert str(run_id) not in response.text, path
        assert str(mine["stepped"]) in answers["/runs"].text
        assert "acme-worker" in answers["/workers"].text
        assert "no runs match" in filtered
        assert {path: r.status_code for path, r in other.items()} == {
            path: 404 for path in other}


class TestEscaping:
    async def test_every_value_on_every_page_is_escaped(self, admin, database_dsn):
        runs = await seed(admin, "acme", worker_id=XSS)
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            answers = {path: client.get(path) for path in pages(runs)}
        for path, response in answers.items():
            assert response.status_code == 200, (path, response.text)
            text = response.text if path != "/overview.json" else response.json()["html"]
            assert "<script>alert" not in text, path
            assert "<img src=x" not in text, path
        detail = answers[f"/runs/{runs['stepped']}"].text
        assert detail.count("&lt;script&gt;") >= 4  # payload, key, thread, step key, result
        assert "&lt;script&gt;" in answers[f"/runs/{runs['waiting']}"].text  # the wait's step
        assert "&lt;script&gt;" in answers["/workers"].text
        assert "&lt;script&gt;" in answers["/"].text  # the deployment
        for path in ("/deployments", "/schedules", "/events"):
            assert "&lt;script&gt;" in answers[path].text, path


class TestCsrf:
    @pytest.mark.parametrize("path", ACTIONS)
    @pytest.mark.parametrize("token", [None, "", "0" * 64, "not-hex"])
    async def test_a_missing_or_wrong_token_is_refused(self, admin, database_dsn, path, token):
        runs = await seed(admin, "acme")
        before = await snapshot(admin)
        form = {"run_id": str(runs["dead"] if "redrive" in path else runs["pending"]),
                "deployment": "dead", "tenant": "acme", "op": "cancel",
                "ids": str(runs["pending"])}
        if token is not None:
            form["csrf"] = token
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            client.get("/")  # a session cookie
            response = client.post(path, data=form)
        assert response.status_code == 403
        assert "CSRF" in response.text
        assert await snapshot(admin) == before


class TestToken:
    async def test_the_token_guards_every_route(self, admin, database_dsn):
        runs = await seed(admin, "acme")
        before = await snapshot(admin)
        routes = [*pages(runs), "/static/web.css", "/static/web.js", "/static/nothing",
                  "/no-such-page"]
        with dashboard(create_app(database_dsn, enable_actions=True, token="s3cret")) as client:
            refused = {path: client.get(path).status_code for path in routes}
            posts = {path: client.post(path, data={"run_id": str(runs["dead"])}).status_code
                     for path in ACTIONS}
            wrong = client.get("/", headers={"Authorization": "Bearer s3cre"}).status_code
            assert client.get("/overview.json?token=s3cret").status_code == 200
            allowed = client.get("/static/web.js").status_code  # the cookie set above
        assert refused == {path: 401 for path in routes}
        assert posts == {path: 401 for path in ACTIONS}
        assert wrong == 401
        assert allowed == 200
        assert await snapshot(admin) == before
