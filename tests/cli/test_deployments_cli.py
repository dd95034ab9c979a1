"""``zeroth-pg deployments list | show | set`` (test_cli.cli: in process, one call as a
subprocess) against a fresh test database: what it prints (tables whole when piped, --json),
exit codes, what changed in the database, and what a zeroth_worker may do with it."""

from __future__ import annotations

import json

from roles import dsn_as, login_role
from test_cli import cli, ok_json

LONG = "a-deployment-with-a-rather-long-name-" + "x" * 60


class TestDeploymentsCommand:
    async def test_set_list_show_and_a_psql_enqueue_gets_the_value(self, database_dsn, connect):
        conn = await connect()
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                           "max_attempts => 4, priority => 1)")
        changed = ok_json(cli("deployments", "set", "mail", "--max-attempts", "8", "--json",
                              dsn=database_dsn))
        assert (changed["outcome"], changed["max_attempts"], changed["priority"],
                changed["managed_by"], changed["previous"]) == (
            "updated", 8, 1, "sql", {"max_attempts": 4, "priority": 1, "managed_by": "app"})
        listed = ok_json(cli("deployments", "list", "--json", dsn=database_dsn))
        assert [(r["deployment_ref"], r["max_attempts"], r["version"]) for r in listed] == [
            ("mail", 8, 2)]
        await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, "
                           "max_concurrency) VALUES ('acme', 'mail', 5)")
        shown = ok_json(cli("deployments", "show", "mail", "--json", dsn=database_dsn))
        assert shown["deployment"]["max_attempts"] == 8
        assert [(s["tenant_id"], s["max_concurrency"]) for s in shown["scope_limits"]] == [
            ("acme", 5)]
        assert [(c["version"], c["via"]) for c in shown["changes"]] == [
            (2, "set_deployment_defaults"), (1, "register_deployment")]
        run_id = await conn.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'mail')")
        assert await conn.fetchval("SELECT max_attempts FROM zeroth.runs WHERE run_id = $1",
                                   run_id) == 8

    def test_piped_tables_keep_every_name_and_value_whole(self, database_dsn):
        ok_json(cli("deployments", "set", LONG, "--max-attempts", "12", "--json",
                    dsn=database_dsn))
        listed = cli("deployments", "list", dsn=database_dsn, env={"COLUMNS": "60"})
        assert listed.returncode == 0, listed.stderr
        line = next(line for line in listed.stdout.splitlines() if LONG in line)
        assert "12" in line.split(LONG, 1)[1]
        shown = cli("deployments", "show", LONG, dsn=database_dsn, env={"COLUMNS": "60"})
        assert shown.returncode == 0, shown.stderr
        assert any(LONG in line for line in shown.stdout.splitlines())
        assert "set_deployment_defaults" in shown.stdout

    def test_an_unregistered_deployment_is_not_found(self, database_dsn):
        result = cli("deployments", "show", "nope", dsn=database_dsn, process=True)
        assert result.returncode == 4
        assert "no deployment named 'nope'" in result.stderr

    async def test_a_bad_value_is_a_usage_error_and_changes_nothing(self, database_dsn, connect):
        result = cli("deployments", "set", "mail", "--max-attempts", "0", dsn=database_dsn)
        assert result.returncode == 2
        assert "max_attempts" in result.stderr
        nothing = cli("deployments", "set", "mail", dsn=database_dsn)
        assert nothing.returncode == 2
        assert "nothing to set" in nothing.stderr
        conn = await connect()
        assert await conn.fetchval("SELECT count(*) FROM zeroth.deployments") == 0
        assert await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == 0

    async def test_a_worker_lists_and_shows_but_may_not_set(self, database_dsn, connect):
        conn = await connect()
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                           "max_attempts => 4)")
        with login_role(database_dsn, "zeroth_worker") as (name, password):
            as_worker = dsn_as(database_dsn, name, password)
            listed = ok_json(cli("deployments", "list", "--json", dsn=as_worker))
            assert [r["deployment_ref"] for r in listed] == ["mail"]
            shown = cli("deployments", "show", "mail", "--json", dsn=as_worker)
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["changes"] is None
            assert "may not read" in shown.stderr
            refused = cli("deployments", "set", "mail", "--max-attempts", "9", dsn=as_worker)
            assert refused.returncode == 1
            assert "permission denied" in refused.stderr
        assert await conn.fetchval("SELECT max_attempts FROM zeroth.deployments") == 4

    async def test_zeroth_pg_enqueue_without_values_gets_the_registered_ones(self, database_dsn,
                                                                              connect):
        ok_json(cli("deployments", "set", "mail", "--max-attempts", "6", "--priority", "2",
                    "--json", dsn=database_dsn))
        one = ok_json(cli("enqueue", "--deployment", "mail", "--json", dsn=database_dsn))
        explicit = ok_json(cli("enqueue", "--deployment", "mail", "--max-attempts", "1",
                               "--json", dsn=database_dsn))
        batch = cli("enqueue", "--deployment", "mail", "--batch", "--json", dsn=database_dsn,
                    stdin='{"payload": {}}\n{"priority": 9}\n')
        assert batch.returncode == 0, batch.stderr
        ids = [one["run_id"], explicit["run_id"],
               *(json.loads(line)["run_id"] for line in batch.stdout.splitlines())]
        conn = await connect()
        values = {str(r["run_id"]): (r["max_attempts"], r["priority"]) for r in await conn.fetch(
            "SELECT run_id, max_attempts, priority FROM zeroth.runs")}
        assert [values[i] for i in ids] == [(6, 2), (1, 2), (6, 2), (6, 9)]


class TestRetryPolicyAndLease:
    async def test_set_shows_and_unsets_the_retry_policy_and_lease(self, database_dsn, connect):
        changed = ok_json(cli("deployments", "set", "mail", "--retry-base", "5", "--retry-max",
                              "120", "--lease", "900", "--json", dsn=database_dsn))
        assert (changed["outcome"], changed["retry_base_seconds"], changed["retry_max_seconds"],
                changed["lease_seconds"]) == ("created", 5, 120, 900)
        listed = ok_json(cli("deployments", "list", "--json", dsn=database_dsn))
        assert [(r["retry_base_seconds"], r["retry_max_seconds"], r["lease_seconds"])
                for r in listed] == [(5, 120, 900)]
        table = cli("deployments", "list", dsn=database_dsn, env={"COLUMNS": "200"})
        assert table.returncode == 0, table.stderr
        assert "lease (s)" in table.stdout
        assert "retry base (s)" in table.stdout
        line = next(line for line in table.stdout.splitlines() if "mail" in line)
        assert "900" in line
        assert "120" in line
        cleared = ok_json(cli("deployments", "set", "mail", "--unset", "lease_seconds",
                              "--json", dsn=database_dsn))
        assert (cleared["outcome"], cleared["lease_seconds"], cleared["retry_base_seconds"]) == (
            "updated", None, 5)
        shown = ok_json(cli("deployments", "show", "mail", "--json", dsn=database_dsn))
        old = shown["changes"][0]["old_values"]
        assert (json.loads(old) if isinstance(old, str) else old)["lease_seconds"] == 900
        conn = await connect()
        await conn.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail')")
        await conn.execute("SELECT * FROM zeroth.claim_pending(deployment_ref => 'mail', "
                           "worker_id => 'w')")
        leased = await conn.fetchval("SELECT lease_expires_at - lease_acquired_at "
                                     "FROM zeroth.runs WHERE deployment_ref = 'mail'")
        assert leased.total_seconds() == 60  # unset: a claim's own 60 s


    async def test_set_shows_and_unsets_the_timeouts(self, database_dsn):
        changed = ok_json(cli("deployments", "set", "mail", "--attempt-timeout", "900",
                              "--run-timeout", "21600", "--json", dsn=database_dsn))
        assert (changed["attempt_timeout_seconds"], changed["run_timeout_seconds"]) == (
            900, 21600)
        table = cli("deployments", "list", dsn=database_dsn, env={"COLUMNS": "250"})
        assert table.returncode == 0, table.stderr
        assert "attempt timeout (s)" in table.stdout
        assert "21600" in next(line for line in table.stdout.splitlines() if "mail" in line)
        cleared = ok_json(cli("deployments", "set", "mail", "--unset", "attempt_timeout_seconds",
                              "--json", dsn=database_dsn))
        assert (cleared["attempt_timeout_seconds"], cleared["run_timeout_seconds"]) == (
            None, 21600)
        bad = cli("deployments", "set", "mail", "--attempt-timeout", "0.5", dsn=database_dsn)
        assert bad.returncode == 2, (bad.stdout, bad.stderr)

    async def test_a_bad_policy_is_a_usage_error_and_changes_nothing(self, database_dsn,
                                                                     connect):
        for args in (("--lease", "0"), ("--lease", "86401"), ("--retry-base", "10",
                                                              "--retry-max", "5"),
                     ("--retry-base", "-1"), ("--retry-max", "nan")):
            result = cli("deployments", "set", "mail", *args, dsn=database_dsn)
            assert result.returncode == 2, (args, result.stdout, result.stderr)
            assert "seconds" in result.stderr, args
        unknown = cli("deployments", "set", "mail", "--unset", "priority", dsn=database_dsn)
        assert unknown.returncode == 2
        conn = await connect()
        assert await conn.fetchval("SELECT count(*) FROM zeroth.deployments") == 0
        assert await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == 0
