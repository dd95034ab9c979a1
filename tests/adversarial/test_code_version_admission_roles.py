"""Code versions recorded by admit-and-own and start_run, and pruned by prune_runs (issue 34),
against the roles the product keeps out, on a database exactly as shipped (no test hook):

* a zeroth_worker's owned admission and first start record its declared version (bounded: ZP008
  for a bad one, nothing changed); a stale holder (another worker, an older generation, its
  lease taken over) and another tenant start nothing and record nothing, and a started run
  keeps its version whatever its holder's start_run declares;
* a LOGIN role with no grant and a zeroth_reader can call neither, nor prune_runs, nor the
  version lock helper;
* only a DBA prunes: a zeroth_worker cannot call prune_runs nor delete zeroth.code_versions.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

ADMIT = """SELECT run_id, lease_generation FROM zeroth.admit_run(deployment_ref => 'mail',
               thread_id => $1, worker_id => $2, tenant_id => $3, code_version => $4)"""
START = """SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3,
               tenant_id => $4, code_version => $5)"""
VERSION_OF = """SELECT (SELECT v.code_version FROM zeroth.code_versions v
                         WHERE v.version_id = r.code_version_id LIMIT 1), r.status::text
                  FROM zeroth.runs r WHERE r.run_id = $1"""


async def refused(conn: asyncpg.Connection, query: str, *args: Any) -> str | None:
    try:
        await conn.fetch(query, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


class TestAWorker:
    async def test_its_owned_admission_and_start_record_its_version(self, login, admin):
        worker = await login("worker")
        row = await worker.fetchrow(ADMIT, "t1", "w1", "acme", "v1")
        assert row["lease_generation"] == 1
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == ("v1", "pending")

        assert await worker.fetchval(START, row["run_id"], "w1", 1, "acme", "v1")
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == ("v1", "running")
        # a started run keeps its version, whatever its holder declares on a later start
        assert await worker.fetchval(START, row["run_id"], "w1", 1, "acme", "v2")
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == ("v1", "running")

    @pytest.mark.parametrize("version", ["", "v 1", "x" * 129, "'; DROP TABLE x; --"])
    async def test_a_bad_version_is_refused_and_changes_nothing(self, login, admin, version):
        worker = await login("worker")
        row = await worker.fetchrow(ADMIT, "t1", "w1", "acme", None)
        runs = await admin.fetchval("SELECT count(*) FROM zeroth.runs")

        assert await refused(worker, ADMIT, "t2", "w1", "acme", version) == "ZP008"
        assert await refused(worker, START, row["run_id"], "w1", 1, "acme", version) == "ZP008"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == runs
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == (None, "pending")
        assert await admin.fetchval("SELECT count(*) FROM zeroth.code_versions") == 0

    async def test_a_stale_holder_or_another_tenant_starts_and_records_nothing(self, login,
                                                                               admin):
        victim = await login("worker")
        row = await victim.fetchrow(ADMIT, "t1", "w1", "acme", None)
        attacker = await login("worker")

        assert not await attacker.fetchval(START, row["run_id"], "w2", 1, "acme", "evil")
        assert not await attacker.fetchval(START, row["run_id"], "w1", 0, "acme", "evil")
        assert not await attacker.fetchval(START, row["run_id"], "w1", 1, "globex", "evil")
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == (None, "pending")
        assert await admin.fetchval("SELECT count(*) FROM zeroth.code_versions") == 0

    async def test_cannot_prune_nor_delete_versions(self, login, admin):
        worker = await login("worker")
        await worker.fetchrow(ADMIT, "t1", "w1", "acme", "v1")

        assert await refused(worker, "SELECT zeroth.prune_runs(older_than => '0'::interval)"
                             ) == "42501"
        assert await refused(worker, "DELETE FROM zeroth.code_versions") == "42501"
        assert await refused(worker, "SELECT * FROM zeroth._code_version_lock(1)") == "42501"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.code_versions") == 1


class TestNoGrantAndReader:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_call_none_of_them(self, login, admin, kind):
        worker = await login("worker")
        row = await worker.fetchrow(ADMIT, "t1", "w1", "acme", "v1")
        stranger = await login(kind)

        assert await refused(stranger, ADMIT, "t2", "w9", "acme", "v9") == "42501"
        assert await refused(stranger, START, row["run_id"], "w1", 1, "acme", "v9") == "42501"
        assert await refused(stranger, "SELECT zeroth.prune_runs(older_than => '0'::interval)"
                             ) == "42501"
        assert await refused(stranger, "SELECT * FROM zeroth._code_version_lock(1)") == "42501"
        assert tuple(await admin.fetchrow(VERSION_OF, row["run_id"])) == ("v1", "pending")
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 1
