"""The fleet's /metrics (zeroth-pg web, zeroth_pg.fleet_metrics) as the people it must keep in
their place, on the database as shipped: a LOGIN role with no grant gets no number; a reader with
zeroth.tenant_id set counts only its tenant; a deployment name chosen to break the exposition
format (quotes, backslashes, a newline, a forged series) stays one label value."""

from __future__ import annotations

from typing import Any

import asyncpg
from fleet_states import samples, value
from helpers import dashboard
from roles import dsn_as, login_role

from zeroth_pg.web import create_app

HOSTILE = 'x"} 1\nzeroth_fleet_runs{deployment="forged",state="due"} 999\n\\'


async def _enqueue(admin: asyncpg.Connection, deployment: str, tenant: str) -> Any:
    return await admin.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2)",
        deployment, tenant)


async def test_a_role_with_no_grant_gets_no_number(admin, pg_server_dsn, database_dsn):
    await _enqueue(admin, "mail", "acme")
    with login_role(pg_server_dsn, None) as (name, password), \
            dashboard(create_app(dsn_as(database_dsn, name, password))) as client:
        response = client.get("/metrics")
    assert response.status_code == 403
    assert "42501" in response.text
    assert "zeroth_fleet" not in response.text
    assert "mail" not in response.text


async def test_a_tenant_reader_counts_its_own_tenant_only(admin, pg_server_dsn, database_dsn):
    for tenant, n in (("acme", 2), ("initech", 5)):
        for _ in range(n):
            await _enqueue(admin, "mail", tenant)
    with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
        await admin.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'acme'")
        with dashboard(create_app(dsn_as(database_dsn, name, password))) as client:
            text = client.get("/metrics").text
    assert value(samples(text), "zeroth_fleet_runs", deployment="mail", state="pending") == 2.0


async def test_a_hostile_deployment_name_stays_one_label_value(admin, database_dsn):
    await _enqueue(admin, HOSTILE, "acme")
    with dashboard(create_app(database_dsn)) as client:
        text = client.get("/metrics").text
    found = samples(text)
    assert value(found, "zeroth_fleet_runs", deployment=HOSTILE, state="pending") == 1.0
    assert not any(("deployment", "forged") in labels for _, labels in found)
    assert {labels for _, labels in found} == {
        labels for _, labels in found if ("deployment", HOSTILE) in labels}
