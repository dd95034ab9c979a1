"""zeroth.code_versions is written by the claims a zeroth_worker calls (zeroth._code_version_id
inserts the text of every version declared, first seen), read by every tenant's zeroth_reader,
and never pruned. A worker must not be able to grow it without leasing anything: a claim that
leases no run records no version. Today every claim call records its declared version up
front, so a zeroth_worker that loops over fresh labels on a deployment with no work at all fills
the table, one row a call, for ever (nothing deletes them but a DBA)."""

from __future__ import annotations

CLAIMS = (
    "SELECT * FROM zeroth.claim_pending(deployment_ref => 'idle', worker_id => 'w', "
    "tenant_id => 'acme', code_version => $1)",
    "SELECT * FROM zeroth.claim_and_start(deployment_ref => 'idle', worker_id => 'w', "
    "tenant_id => 'acme', code_version => $1)",
    "SELECT * FROM zeroth.claim_and_start_scopes(deployment_refs => ARRAY['idle'], "
    "worker_id => 'w', code_version => $1)",
)


async def test_a_claim_that_leases_nothing_records_no_code_version(login, admin):
    worker = await login("worker")
    for i in range(30):
        for statement in CLAIMS:
            rows = await worker.fetch(statement, f"junk-{i}-{len(statement)}")
            assert [r for r in rows if r["run_id"] is not None] == []

    assert await admin.fetchval("SELECT count(*) FROM zeroth.code_versions") == 0
