"""zeroth-pg web's GET /metrics: the fleet's database gauges (zeroth_pg.fleet_metrics), served
once per fleet, behind the dashboard's Host check and token like every page."""

from __future__ import annotations

import uuid

import asyncpg
from fleet_states import check_scrape, due_age, samples, seed, value
from helpers import dashboard
from roles import dsn_as, login_role

from zeroth_pg.web import create_app


async def test_metrics_serve_every_state_of_a_deployment_summed_over_its_scopes(database_dsn):
    dep = f"fleet-{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(database_dsn)
    try:
        run_after = await seed(conn, dep)
        before = await due_age(conn, run_after)
        with dashboard(create_app(database_dsn)) as client:
            response = client.get("/metrics")
        after = await due_age(conn, run_after)
    finally:
        await conn.close()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    check_scrape(response.text, dep, age_before=before, age_after=after)


def test_metrics_need_the_token_and_an_allowed_host_like_every_page(database_dsn):
    with dashboard(create_app(database_dsn, token="s3cret")) as client:
        refused = client.get("/metrics")
        bearer = client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
        wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
        foreign = client.get("/metrics", headers={"Host": "evil.example",
                                                  "Authorization": "Bearer s3cret"})
    assert refused.status_code == 401
    assert "zeroth_fleet" not in refused.text
    assert wrong.status_code == 401
    assert bearer.status_code == 200  # what Prometheus sends (authorization: credentials)
    assert "zeroth_fleet_runs" in bearer.text
    assert foreign.status_code == 421  # Misdirected Request: a DNS-rebinding page gets nothing
    assert "zeroth_fleet" not in foreign.text


async def test_a_tenant_reader_scrapes_its_own_tenant_only(database_dsn, pg_server_dsn):
    dep = f"fleet-{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(database_dsn)
    try:
        await seed(conn, dep)
        with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
            await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'initech'")
            with dashboard(create_app(dsn_as(database_dsn, name, password))) as client:
                text = client.get("/metrics").text
    finally:
        await conn.close()
    found = samples(text)
    # initech holds one due run, the orphan and the failed run; acme's are not counted.
    assert value(found, "zeroth_fleet_runs", deployment=dep, state="pending") == 1.0
    assert value(found, "zeroth_fleet_runs", deployment=dep, state="running") == 1.0
    assert value(found, "zeroth_fleet_runs", deployment=dep, state="failed") == 1.0
    assert value(found, "zeroth_fleet_runs", deployment=dep, state="dead_lettered") == 0.0
    assert value(found, "zeroth_fleet_expired_leases", deployment=dep) == 1.0
