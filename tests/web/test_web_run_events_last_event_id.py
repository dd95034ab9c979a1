"""GET /runs/{run_id}/events: a Last-Event-ID that str.isdigit()
accepts but int() refuses (a superscript digit) is a client error, not a 500."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import dashboard
from test_web_run_events import _finished_run_with_events

from zeroth_pg.web import create_app


@pytest.mark.parametrize("last_event_id", ["²", "1²", "\u0663\u0664", "\uff11"])
async def test_a_non_ascii_digit_last_event_id_is_refused_with_400(database_dsn, last_event_id):
    conn = await asyncpg.connect(database_dsn)
    try:
        run_id = await _finished_run_with_events(conn, ["a"])
        with dashboard(create_app(database_dsn), raise_server_exceptions=False) as client:
            by_query = client.get(f"/runs/{run_id}/events", params={"after": last_event_id})
            by_header = (client.get(f"/runs/{run_id}/events",
                                    headers={"Last-Event-ID": last_event_id.encode("latin-1")})
                         if last_event_id.isascii() or max(map(ord, last_event_id)) < 256
                         else by_query)
    finally:
        await conn.close()

    assert (by_query.status_code, by_header.status_code) == (400, 400)
