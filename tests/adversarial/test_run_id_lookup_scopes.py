"""A run looked up by its id alone (zeroth_pg._calls.run_by_id: `zeroth-pg runs show`, the
dashboard's run page, search, bulk status and action scope) is one probe of runs_pkey, which
leads with run_id since migration 0023, through the security_invoker view zeroth.run_list. A
tenant's zeroth_reader finds its own tenant's run of an id and never another tenant's, also when
two tenants hold a run of that same id (run_id is unique per scope only), and a worker role of
another tenant can neither enqueue over a run of another scope nor read it through the view.
"""

from __future__ import annotations

import uuid

import asyncpg

from zeroth_pg import _calls
from zeroth_pg.web import run_filters
from zeroth_pg.web.app import _RUN, _SCOPE_OF_RUN
from zeroth_pg.web.bulk import _STATUS_BY_ID
from zeroth_pg.web.pages_run_events import _SCOPE

ENQUEUE = """SELECT run_id, created FROM zeroth.enqueue_run(deployment_ref => 'd',
                 tenant_id => $1, run_id => $2)"""


async def _lookups(conn: asyncpg.Connection, run_id: uuid.UUID) -> dict[str, list[str]]:
    """The tenants each by-id query of the client, CLI and dashboard answers for ``run_id``."""
    search, args = run_filters.run_page_query({"search": str(run_id)}, None, 50)
    found = {
        "FIND_RUN": await conn.fetch(_calls.FIND_RUN, run_id, None, None),
        "run page": await conn.fetch(_RUN, run_id),
        "action scope": await conn.fetch(_SCOPE_OF_RUN, run_id),
        "event stream scope": await conn.fetch(_SCOPE, run_id),
        "search": await conn.fetch(search, *args),
    }
    tenants = {name: sorted(r["tenant_id"] for r in rows) for name, rows in found.items()}
    tenants["bulk status"] = ["?"] * len(await conn.fetch(_STATUS_BY_ID, run_id))
    return tenants


async def test_a_tenant_reader_finds_by_id_only_its_tenants_run(login, admin):
    shared, theirs = uuid.uuid4(), uuid.uuid4()
    for tenant, run_id in (("acme", shared), ("zeta", shared), ("zeta", theirs)):
        assert tuple(await admin.fetchrow(ENQUEUE, tenant, run_id)) == (run_id, True)
    # The same id in two scopes: two runs, for whoever sees every tenant.
    assert (await _lookups(admin, shared))["FIND_RUN"] == ["acme", "zeta"]

    reader = await login("reader")
    await reader.execute("SET zeroth.tenant_id = 'acme'")
    assert await _lookups(reader, shared) == {
        "FIND_RUN": ["acme"], "run page": ["acme"], "action scope": ["acme"],
        "event stream scope": ["acme"], "search": ["acme"], "bulk status": ["?"]}
    assert await _lookups(reader, theirs) == {
        "FIND_RUN": [], "run page": [], "action scope": [], "event stream scope": [],
        "search": [], "bulk status": []}
    # Unset: no run at all.
    await reader.execute("RESET zeroth.tenant_id")
    assert set(map(len, (await _lookups(reader, shared)).values())) == {0}


async def test_another_tenants_worker_neither_overwrites_nor_reads_a_run_of_the_same_id(
        login, admin):
    victim = uuid.uuid4()
    assert tuple(await admin.fetchrow(ENQUEUE, "acme", victim)) == (victim, True)
    before = tuple(await admin.fetchrow(
        "SELECT status::text, payload::text, updated_at FROM zeroth.runs "
        "WHERE run_id = $1 AND tenant_id = 'acme'", victim))
    worker = await login("worker")
    # Its own run of that id, in its own scope: created, the other scope's run untouched.
    assert tuple(await worker.fetchrow(ENQUEUE, "zeta", victim)) == (victim, True)
    assert tuple(await admin.fetchrow(
        "SELECT status::text, payload::text, updated_at FROM zeroth.runs "
        "WHERE run_id = $1 AND tenant_id = 'acme'", victim)) == before
    # A worker role has no SELECT on zeroth.runs nor zeroth.run_list.
    for query in (_calls.FIND_RUN, _RUN):
        try:
            await worker.fetch(query, victim, *((None, None) if query is _calls.FIND_RUN else ()))
        except asyncpg.InsufficientPrivilegeError:
            continue
        raise AssertionError("a worker role read a run by its id through zeroth.run_list")
