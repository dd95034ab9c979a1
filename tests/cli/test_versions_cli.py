"""Code versions (issue 34, item 3) in ``zeroth-pg status``: the runs pinned to a code version
(zeroth.pinned_runs) under the status table and in its --json, filtered like the rest."""

from __future__ import annotations

from test_cli import cli, ok_json


async def pinned_fleet(conn) -> None:  # type: ignore[no-untyped-def]
    """'mail' under policy same: two runs started by v1 and handed back (pending, due, pinned),
    one run started by v2 and running; 'other' under policy any (nothing pinned)."""
    for deployment in ("mail", "other"):
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", deployment)
    await conn.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => 'mail', "
                       "version_policy => 'same')")
    for version, count in (("v1", 2), ("v2", 1)):
        for _ in range(count):
            await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail', "
                               "tenant_id => 'acme')")
        rows = await conn.fetch(
            "SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'mail', "
            "worker_id => $1, tenant_id => 'acme', batch_size => 10, code_version => $1)", version)
        assert len([r for r in rows if r["run_id"]]) == count
        if version == "v1":
            for row in rows:
                assert await conn.fetchval(
                    "SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'v1', "
                    "generation => $2, tenant_id => 'acme')", row["run_id"],
                    row["lease_generation"])
    await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => 'other')")
    await conn.execute("SELECT zeroth.claim_and_start(deployment_ref => 'other', worker_id => 'x', "
                       "code_version => 'v1')")


class TestStatusShowsPinnedRuns:
    async def test_json_and_table_count_the_runs_waiting_for_their_version(self, database_dsn,
                                                                            connect):
        await pinned_fleet(await connect())
        status = ok_json(cli("status", "--json", dsn=database_dsn))
        assert [(p["tenant_id"], p["deployment_ref"], p["code_version"], p["version_policy"],
                 p["pending"], p["running"], p["waiting_for_version"])
                for p in status["pinned"]] == [("acme", "mail", "v1", "same", 2, 0, 2),
                                               ("acme", "mail", "v2", "same", 0, 1, 0)]
        by_deployment = ok_json(cli("status", "--by", "deployment", "--json", dsn=database_dsn))
        assert len(by_deployment["pinned"]) == 2
        assert ok_json(cli("status", "--json", "--tenant", "other",
                           dsn=database_dsn))["pinned"] == []
        assert ok_json(cli("status", "--json", "--deployment", "other",
                           dsn=database_dsn))["pinned"] == []
        table = cli("status", dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        assert "runs pinned to a code version" in table.stdout
        header = next(line for line in table.stdout.splitlines() if "code version" in line
                      and "policy" in line)
        assert header.split()[:6] == ["tenant", "workspace", "deployment", "code", "version",
                                      "policy"]
        rows = [line.split() for line in table.stdout.splitlines()
                if line.split()[:1] == ["acme"] and "v1" in line.split()]
        assert len(rows) == 1
        assert rows[0][:8] == ["acme", "mail", "v1", "same", "2", "0", "0", "2"]
        assert "retire_code_version" in table.stdout

    async def test_nothing_pinned_shows_no_second_table(self, database_dsn, connect):
        conn = await connect()
        await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail')")
        table = cli("status", dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        assert "pinned" not in table.stdout
