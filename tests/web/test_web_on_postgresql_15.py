"""The dashboard on Debian's PostgreSQL 15 as it comes (initdb's settings): every page of its
route table, /overview.json and /metrics answer, with something on each page.

The rest of tests/web runs on the session's server (PostgreSQL 18). An operator of a 15 server
opens the same pages; a query that only 16+ can plan or run would answer 500 there and nowhere
in the rest of the suite. The pages are filled as the browser test fills them (_seed: history,
pending, running with a step, waiting for an event, a dead letter, a schedule) and fetched over
HTTP (Starlette's TestClient), so this tier needs no browser.
"""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg
import pytest
from helpers import dashboard
from stock_postgres import stock_postgresql_15
from test_web_browser import _seed, pages_of

from zeroth_pg import migrate
from zeroth_pg.testing import install_test_clock

pytestmark = pytest.mark.dedicated_server


@pytest.fixture(scope="module")
def pg15_dsn() -> Iterator[str]:
    """A migrated database with the test clock (_seed writes through it) on a stock 15."""
    with stock_postgresql_15() as server:
        dsn = server.database("web")
        migrate.upgrade(dsn)
        install_test_clock(dsn)
        yield dsn


async def test_every_page_the_overview_feed_and_metrics_answer_on_postgresql_15(
        pg15_dsn: str) -> None:
    from zeroth_pg.web import create_app

    conn = await asyncpg.connect(pg15_dsn)
    try:
        assert (await conn.fetchval("SHOW server_version_num")).startswith("15")
        samples = await _seed(conn)
    finally:
        await conn.close()
    app = create_app(pg15_dsn, enable_actions=True)
    pages, missing = pages_of(app, samples)
    assert not missing, f"add a sample for these pages' parameters: {missing}"
    assert {"overview", "runs", "runs-detail", "dead-letters", "workers", "bulk"} <= set(pages)
    with dashboard(app) as client:
        for path in pages.values():
            page = client.get(path)
            assert page.status_code == 200, (path, page.text[-2000:])
            assert "zeroth-pg" in page.text, path
        overview = client.get("/overview.json")
        assert overview.status_code == 200, overview.text[-2000:]
        metrics = client.get("/metrics")
        assert metrics.status_code == 200, metrics.text[-2000:]
        assert "zeroth_fleet_runs{" in metrics.text
