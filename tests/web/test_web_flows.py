"""zeroth-pg web, the operator's flows over HTTP (Starlette's TestClient) against a real database:
bulk cancel and redrive of a filtered selection through a confirmation that names the runs, the
selection changing between the confirmation and the action, the per-action bound, bad input, a
reader, a foreign Host or Origin; keyset paging both ways with bounded totals."""

from __future__ import annotations

import re
import uuid

import asyncpg
from helpers import dashboard, make_run
from roles import dsn_as, login_role
from test_web_pages import FOREIGN_HOST, FOREIGN_ORIGIN, _csrf, _dead_letter, _now, _status

from zeroth_pg.web import create_app

_IDS = re.compile(r'name="ids" value="([0-9a-f -]*)"')


def _confirmed(html: str) -> list[str]:
    found = _IDS.search(html)
    assert found, "no confirmation form in the page"
    return found.group(1).split()


def _listed(html: str) -> list[str]:
    return re.findall(r'href="/runs/([0-9a-f-]{36})[?"]', html)


class TestBulkActions:
    async def test_bulk_cancel_confirms_how_many_and_which_and_acts_on_those_ids_only(
            self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            pending = [(await make_run(conn, "pending", deployment_ref="mail", now=now)).run_id
                       for _ in range(24)]
            running = await make_run(conn, "running", deployment_ref="mail", now=now,
                                     lease_seconds=600)
            finished = await make_run(conn, "completed", deployment_ref="mail", now=now)
            other = await make_run(conn, "pending", deployment_ref="sms", now=now)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/bulk?op=cancel&source=runs&deployment=mail")
                assert page.status_code == 200
                ids = _confirmed(page.text)
                # How many and which: the count, the first ids listed, the rest counted.
                assert sorted(ids) == sorted(str(i) for i in [*pending, running.run_id])
                assert "25 run(s) match" in page.text
                assert "Cancel 25 runs?" in page.text
                assert len(set(_listed(page.text))) == 20
                assert "… and 5 more" in page.text
                assert str(finished.run_id) not in page.text
                assert str(other.run_id) not in page.text
                # Between the confirmation and the action: one confirmed run is cancelled by
                # someone else, and a new run starts to match the filter.
                assert await conn.fetchval(
                    "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
                    pending[0], now) == "cancelled"
                late = await make_run(conn, "pending", deployment_ref="mail", now=now)
                done = client.post("/actions/bulk", data={
                    "csrf": _csrf(page.text), "op": "cancel", "source": "runs",
                    "deployment": "mail", "ids": " ".join(ids)})
            assert done.status_code == 200, done.text
            assert "24 of 25 confirmed runs" in done.text
            assert "1 skipped" in done.text
            skipped = done.text.split('id="bulk-skipped"', 1)[1].split("</table>", 1)[0]
            assert str(pending[0]) in skipped
            assert "already finished" in skipped
            assert "cancel requested" in done.text  # the running run: its owner stops it
            assert [await _status(conn, i) for i in pending] == ["cancelled"] * 24
            assert await conn.fetchval(
                "SELECT cancel_requested_at IS NOT NULL FROM zeroth.runs WHERE run_id = $1",
                running.run_id)
            assert await _status(conn, late.run_id) == "pending"  # not confirmed: not touched
            assert await _status(conn, other.run_id) == "pending"
            assert await _status(conn, finished.run_id) == "completed"
        finally:
            await conn.close()

    async def test_bulk_redrive_of_dead_letters_and_of_failed_runs(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            mail = [await _dead_letter(conn, "mail", now) for _ in range(3)]
            sms = await _dead_letter(conn, "sms", now)
            cancelled = await make_run(conn, "cancelled", deployment_ref="sms", now=now)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/bulk?op=redrive&source=dead&deployment=mail")
                assert page.status_code == 200
                assert sorted(_confirmed(page.text)) == sorted(str(i) for i in mail)
                assert "3 dead letter(s) match" in page.text
                r = client.post("/actions/bulk", data={
                    "csrf": _csrf(page.text), "op": "redrive", "source": "dead",
                    "ids": " ".join(_confirmed(page.text))})
                assert r.status_code == 200
                assert "3 of 3 confirmed" in r.text
                assert [await _status(conn, i) for i in mail] == ["pending"] * 3
                assert await _status(conn, sms) == "failed"
                # The runs list's filter, any redrivable status: sms's dead letter and its
                # cancelled run.
                page = client.get("/bulk?op=redrive&deployment=sms")
                assert sorted(_confirmed(page.text)) == sorted([str(sms), str(cancelled.run_id)])
                # A filter on a status the action does not take selects nothing, and says why.
                none = client.get("/bulk?op=redrive&status=pending&deployment=mail")
                assert none.status_code == 200
                assert 'id="bulk-note"' in none.text
                assert 'name="ids"' not in none.text
                dead_cancel = client.get("/bulk?op=cancel&source=dead")
                assert dead_cancel.status_code == 400
        finally:
            await conn.close()

    async def test_a_bulk_action_takes_at_most_its_bound(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.bulk.BULK_MAX", 3)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            runs = [(await make_run(conn, "pending", deployment_ref="mail", now=now)).run_id
                    for _ in range(5)]
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get("/bulk?op=cancel&deployment=mail")
                ids = _confirmed(page.text)
                assert len(ids) == 3
                assert "More than 3 match" in page.text
                assert "5 run(s) match" in page.text
                too_many = client.post("/actions/bulk", data={
                    "csrf": _csrf(page.text), "op": "cancel",
                    "ids": " ".join(str(i) for i in runs[:4])})
                assert too_many.status_code == 400
                assert "at most 3" in too_many.text
                assert [await _status(conn, i) for i in runs] == ["pending"] * 5
                r = client.post("/actions/bulk", data={"csrf": _csrf(page.text), "op": "cancel",
                                                       "ids": " ".join(ids)})
                assert r.status_code == 200
            statuses = [await _status(conn, i) for i in runs]
            assert sorted(statuses) == ["cancelled"] * 3 + ["pending"] * 2
            # The newest three (the list's order).
            assert [str(i) for i, s in zip(runs, statuses, strict=True) if s == "cancelled"] == \
                sorted(ids, key=lambda i: [str(r) for r in runs].index(i))
        finally:
            await conn.close()

    async def test_bad_input_is_refused_and_the_confirmation_is_for_the_operators_page_only(
            self, database_dsn):
        # A forged, token-less, foreign or read-only POST: test_web_action_guards.py.
        conn = await asyncpg.connect(database_dsn)
        try:
            run = await make_run(conn, "pending", deployment_ref="mail", now=await _now(conn))
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get("/bulk?op=cancel&deployment=mail").text)
                for query in ("op=delete", "op=cancel&source=elsewhere", "op=cancel&since=soon",
                              "op=cancel&status=sleeping", "op=redrive&source=dead&status=x"
                              "&tenant=%00"):
                    r = client.get(f"/bulk?{query}")
                    assert r.status_code == 400, (query, r.text)
                for form in ({"op": "delete", "ids": str(run.run_id)}, {"op": "cancel"},
                             {"op": "cancel", "ids": "   "},
                             {"op": "cancel", "ids": f"{run.run_id} not-a-uuid"},
                             {"op": "cancel", "ids": f"{run.run_id} 'or 1=1"}):
                    r = client.post("/actions/bulk", data={**form, "csrf": csrf})
                    assert r.status_code == 400, (form, r.text)
                # A rebinding page under its own Host name: no confirmation page.
                r = client.get("/bulk?op=cancel",
                               headers={"Host": FOREIGN_HOST, "Origin": FOREIGN_ORIGIN})
                assert r.status_code == 421
                assert "mail" not in r.text
            # Read-only (the default): no confirmation page.
            with dashboard(create_app(database_dsn)) as client:
                assert "bulk" not in client.get("/runs").text
                assert client.get("/bulk?op=cancel").status_code == 403
            assert await _status(conn, run.run_id) == "pending"
        finally:
            await conn.close()

    async def test_a_reader_confirms_only_its_tenants_runs_and_can_never_act(
            self, database_dsn, pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            mine = await make_run(conn, "pending", deployment_ref="mail", now=now,
                                  tenant_id="acme")
            theirs = await make_run(conn, "pending", deployment_ref="mail", now=now,
                                    tenant_id="initech")
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
                reader = dsn_as(database_dsn, name, password)
                with dashboard(create_app(reader, enable_actions=True)) as client:
                    page = client.get("/bulk?op=cancel&deployment=mail")
                    ids = _confirmed(page.text)
                    r = client.post("/actions/bulk", data={
                        "csrf": _csrf(page.text), "op": "cancel",
                        "ids": f"{mine.run_id} {theirs.run_id}"})
            assert ids == [str(mine.run_id)]
            assert str(theirs.run_id) not in page.text
            assert r.status_code == 403
            assert "42501" in r.text
            assert await _status(conn, mine.run_id) == "pending"
            assert await _status(conn, theirs.run_id) == "pending"
        finally:
            await conn.close()


def _walk(client: object, url: str, link: str) -> tuple[list[list[str]], str]:
    """The pages from ``url`` following the link with id ``link`` (next: older, prev: newer)
    to its end: each page's run ids, and the last page's URL."""
    pages = []
    next_url: str | None = url
    while next_url:
        url = next_url
        page = client.get(url)  # type: ignore[attr-defined]
        assert page.status_code == 200, page.text
        pages.append(list(dict.fromkeys(_listed(page.text))))
        found = re.search(rf'id="{link}" href="([^"]+)"', page.text)
        next_url = found.group(1).replace("&amp;", "&") if found else None
        assert len(pages) < 20, "paging does not end"
    return pages, url


class TestPaging:
    async def test_runs_page_both_ways_with_a_total(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.app.PAGE_SIZE", 3)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            ids = [str((await make_run(conn, "pending", deployment_ref="a", now=now)).run_id)
                   for _ in range(8)]
            await make_run(conn, "pending", deployment_ref="b", now=now)
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            first = client.get("/runs?deployment=a")
            older, last = _walk(client, "/runs?deployment=a", "next")
            newer, top = _walk(client, last, "prev")
            bad = [client.get(f"/runs?{q}") for q in (
                "after_at=2026-01-01T00:00:00%2B00:00", "after_id=" + str(uuid.uuid4()),
                "after_at=yesterday&after_id=" + str(uuid.uuid4()),
                "before_at=2026-01-01T00:00:00&before_id=" + str(uuid.uuid4()),
                "after_at=2026-01-01T00:00:00%2B00:00&after_id=" + str(uuid.uuid4())
                + "&before_at=2026-01-01T00:00:00%2B00:00&before_id=" + str(uuid.uuid4()),
                "deployment=a%00")]
        assert [len(p) for p in older] == [3, 3, 2]
        assert sorted(i for p in older for i in p) == sorted(ids)  # each run once
        # Back from the last page: the same pages in reverse, ending on the first, full.
        assert newer == list(reversed(older))
        assert "before_id" in top
        assert 'id="prev"' not in first.text
        assert 'id="next"' in first.text
        assert re.search(r'id="total"[^>]*>8<', first.text)
        assert all(r.status_code == 400 for r in bad), [r.text for r in bad]

    async def test_dead_letters_page_both_ways_with_a_total(self, database_dsn, monkeypatch):
        monkeypatch.setattr("zeroth_pg.web.app.PAGE_SIZE", 2)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            for _ in range(5):
                await _dead_letter(conn, "mail", now)
            await _dead_letter(conn, "sms", now)
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            older, last = _walk(client, "/dead-letters?deployment=mail", "next")
            newer, _ = _walk(client, last, "prev")
            page = client.get(last)
            bad = [client.get(f"/dead-letters?{q}") for q in (
                "before_id=" + str(uuid.uuid4()), "tenant=%00",
                "after_at=2026-01-01T00:00:00%2B00:00&after_id=x")]
        assert [len(p) for p in older] == [2, 2, 1]
        assert len({i for p in older for i in p}) == 5
        assert newer == list(reversed(older))
        assert re.search(r'id="total"[^>]*>5<', page.text)
        assert [r.status_code for r in bad] == [400] * 3

    async def test_a_total_is_capped_and_a_slow_count_is_not_counted(self, database_dsn,
                                                                     monkeypatch):
        from zeroth_pg.web.paging import bounded_count

        monkeypatch.setattr("zeroth_pg.web.paging.COUNT_CAP", 4)
        conn = await asyncpg.connect(database_dsn)
        try:
            now = await _now(conn)
            for _ in range(6):
                await make_run(conn, "pending", deployment_ref="a", now=now)
            with dashboard(create_app(database_dsn)) as client:
                page = client.get("/runs")
            assert re.search(r'id="total"[^>]*>4\+<', page.text)
            # A count that runs past its budget is cancelled by the server, and said so.
            slow = await bounded_count(
                conn, "SELECT count(*) FROM (SELECT pg_sleep(30) LIMIT $1) s", [1])
            assert slow.startswith("not counted")
            assert await conn.fetchval("SELECT 1") == 1  # the connection is usable after
        finally:
            await conn.close()

