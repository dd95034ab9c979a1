"""A run id is unique per scope only (zeroth.runs' key is (run_id, tenant_id, workspace_key)): a
worker role of another tenant may enqueue a run with an id it learned from another scope. The
dashboard's actions name a run by its id, so an operator acting on one tenant's run must never
act on another tenant's run of that id instead (the CLI refuses such an id without --tenant and
--workspace: zeroth_pg.cli.runs._locate).

Here tenant acme's dead letter (the older run) and tenant zeta's dead letter share one run id.
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
from helpers import dashboard
from test_web_pages import _csrf, _dead_letter, _now

from zeroth_pg.web import create_app

STATE = """SELECT tenant_id, status::text, dead_lettered_at IS NOT NULL, attempts
             FROM zeroth.runs WHERE run_id = $1 ORDER BY tenant_id"""


async def _two_scopes(conn: asyncpg.Connection) -> tuple[Any, list[tuple[Any, ...]]]:
    now = await _now(conn)
    run_id = uuid.uuid4()
    assert await _dead_letter(conn, "mail", now, tenant_id="acme", run_id=run_id) == run_id
    assert await _dead_letter(conn, "mail", now, tenant_id="zeta", run_id=run_id) == run_id
    state = [tuple(r) for r in await conn.fetch(STATE, run_id)]
    assert [s[:3] for s in state] == [("acme", "failed", True), ("zeta", "failed", True)]
    return run_id, state


async def test_redriving_one_tenants_dead_letters_leaves_another_tenants_run_of_that_id(
        database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id, before = await _two_scopes(conn)
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            csrf = _csrf(client.get("/dead-letters").text)
            r = client.post("/actions/redrive-matching",
                            data={"deployment": "mail", "tenant": "zeta", "csrf": csrf},
                            follow_redirects=False)
        assert r.status_code == 303, r.text
        after = [tuple(row) for row in await conn.fetch(STATE, run_id)]
        assert after[0] == before[0]  # acme's run: untouched
        assert after[1][:3] == ("zeta", "pending", False)  # zeta's: redriven
    finally:
        await conn.close()


async def test_an_action_on_a_run_id_two_scopes_hold_is_refused_and_changes_nothing(
        database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id, before = await _two_scopes(conn)
        with dashboard(create_app(database_dsn, enable_actions=True)) as client:
            csrf = _csrf(client.get("/dead-letters").text)
            redrive = client.post("/actions/redrive", data={"run_id": str(run_id), "csrf": csrf},
                                  follow_redirects=False)
            cancel = client.post("/actions/cancel", data={"run_id": str(run_id), "csrf": csrf},
                                 follow_redirects=False)
            bulk = client.post("/actions/bulk", data={"op": "redrive", "ids": str(run_id),
                                                      "source": "dead-letters", "tenant": "zeta",
                                                      "csrf": csrf})
        assert redrive.status_code == 409, redrive.text
        assert "several scopes" in redrive.text
        assert cancel.status_code == 409, cancel.text
        assert bulk.status_code == 200, bulk.text
        assert "several scopes" in bulk.text
        # Its status now: none, of two runs (not one scope's status for the id).
        skipped = bulk.text.split(f'href="/runs/{run_id}"', 1)[1].split("</tr>", 1)[0]
        assert "<td>—</td>" in skipped, skipped
        assert [tuple(row) for row in await conn.fetch(STATE, run_id)] == before
    finally:
        await conn.close()


async def test_the_run_page_names_the_other_scope_and_shows_the_one_asked_for(database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id, _ = await _two_scopes(conn)
        await conn.execute("UPDATE zeroth.runs SET payload = jsonb_build_object('of', tenant_id) "
                           "WHERE run_id = $1", run_id)
        with dashboard(create_app(database_dsn)) as client:
            plain = client.get(f"/runs/{run_id}")
            zeta = client.get(f"/runs/{run_id}?tenant=zeta&workspace=")
            none = client.get(f"/runs/{run_id}?tenant=nobody")
        assert plain.status_code == 200
        assert 'id="other-scopes"' in plain.text
        assert f'href="/runs/{run_id}?tenant=zeta&amp;workspace="' in plain.text
        assert zeta.status_code == 200
        assert "&#34;of&#34;: &#34;zeta&#34;" in zeta.text or '"of": "zeta"' in zeta.text
        assert f'href="/runs/{run_id}?tenant=acme&amp;workspace="' in zeta.text
        assert none.status_code == 404
    finally:
        await conn.close()


async def test_the_event_stream_of_a_run_id_two_scopes_hold_names_its_scope(database_dsn):
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id, _ = await _two_scopes(conn)
        with dashboard(create_app(database_dsn)) as client:
            both = client.get(f"/runs/{run_id}/events")
            nobody = client.get(f"/runs/{run_id}/events?tenant=nobody")
        assert both.status_code == 409, both.text
        assert "several scopes" in both.text
        assert nobody.status_code == 404
    finally:
        await conn.close()


async def test_every_list_links_a_run_id_two_scopes_hold_to_the_scope_of_its_row(database_dsn):
    """The runs list and the dead letters of one tenant link to that tenant's run, not to the
    first scope that holds the id; following the link shows that tenant's run."""
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id, _ = await _two_scopes(conn)
        await conn.execute("UPDATE zeroth.runs SET payload = jsonb_build_object('of', tenant_id) "
                           "WHERE run_id = $1", run_id)
        zeta_link = f'href="/runs/{run_id}?tenant=zeta&amp;workspace="'
        with dashboard(create_app(database_dsn)) as client:
            pages = {path: client.get(path).text
                     for path in ("/runs?tenant=zeta", "/dead-letters?tenant=zeta")}
            followed = client.get(f"/runs/{run_id}?tenant=zeta&workspace=")
        for path, html in pages.items():
            assert zeta_link in html, path
            assert f'href="/runs/{run_id}"' not in html, path
            assert "tenant=acme" not in html, path
        assert "&#34;of&#34;: &#34;zeta&#34;" in followed.text or '"of": "zeta"' in followed.text
    finally:
        await conn.close()
