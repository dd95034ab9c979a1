"""``zeroth-pg schedules list | add | pause | resume | fire | delete`` (test_cli.cli: in
process, one call as a subprocess) on a fresh test database: exit codes, --json output and what
changed in the database."""

from __future__ import annotations

import json

from test_cli import cli, ok_json


class TestSchedulesCommand:
    async def test_add_list_pause_resume_delete(self, database_dsn, connect):
        added = ok_json(cli("schedules", "add", "nightly", "--deployment", "d", "--cron",
                            "0 3 * * *", "--tz", "Europe/Berlin", "--payload", '{"k": 1}',
                            "--tenant", "acme", "--json", dsn=database_dsn))
        assert (added[0]["name"], added[0]["timing"], added[0]["time_zone"]) == (
            "nightly", "0 3 * * *", "Europe/Berlin")
        ok_json(cli("schedules", "add", "tick", "--deployment", "d", "--every", "5",
                    "--catch-up", "3", "--tenant", "acme", "--json", dsn=database_dsn))
        listed = ok_json(cli("schedules", "list", "--tenant", "acme", "--json", dsn=database_dsn))
        assert [(r["name"], r["missed"]) for r in listed] == [
            ("nightly", "skip"), ("tick", "catch_up 3")]
        assert ok_json(cli("schedules", "list", "--json", dsn=database_dsn)) == []

        paused = ok_json(cli("schedules", "pause", "tick", "--tenant", "acme", "--json",
                             dsn=database_dsn))
        assert paused[0]["paused"] is True
        resumed = ok_json(cli("schedules", "resume", "tick", "--tenant", "acme", "--json",
                              dsn=database_dsn))
        assert resumed[0]["paused"] is False
        deleted = ok_json(cli("schedules", "delete", "tick", "--tenant", "acme", "--json",
                              dsn=database_dsn))
        assert deleted["name"] == "tick"

        conn = await connect()
        rows = await conn.fetch("SELECT name, payload::text AS payload FROM zeroth.schedules")
        assert [(r["name"], json.loads(r["payload"])) for r in rows] == [("nightly", {"k": 1})]

    def test_a_bad_expression_is_a_usage_error_naming_the_problem(self, database_dsn):
        result = cli("schedules", "add", "bad", "--deployment", "d", "--cron", "0 0 31 2 *",
                     dsn=database_dsn)
        assert result.returncode == 2
        assert "never fires" in result.stderr

    def test_a_missing_schedule_is_not_found(self, database_dsn):
        result = cli("schedules", "pause", "nope", dsn=database_dsn, process=True)
        assert result.returncode == 4
        assert 'no schedule named "nope"' in result.stderr

    def test_the_table_output(self, database_dsn):
        ok_json(cli("schedules", "add", "tick", "--deployment", "d", "--every", "60", "--json",
                    dsn=database_dsn))
        table = cli("schedules", "list", dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        assert "every 60s" in table.stdout

    async def test_fire_makes_one_run_now_and_leaves_the_schedule(self, database_dsn, connect):
        ok_json(cli("schedules", "add", "tick", "--deployment", "d", "--every", "3600",
                    "--tenant", "acme", "--json", dsn=database_dsn))
        fired = ok_json(cli("schedules", "fire", "tick", "--tenant", "acme", "--json",
                            dsn=database_dsn))
        conn = await connect()
        run = await conn.fetchrow("SELECT tenant_id, deployment_ref, status::text AS status "
                                  "FROM zeroth.runs WHERE run_id = $1::uuid", fired["run_id"])
        assert tuple(run) == ("acme", "d", "pending")
        assert await conn.fetchval("SELECT fire_count FROM zeroth.schedules") == 0
        missing = cli("schedules", "fire", "tick", dsn=database_dsn)  # the default tenant's
        assert missing.returncode == 4
        assert 'no schedule named "tick"' in missing.stderr

    async def test_fire_with_one_key_twice_makes_one_run(self, database_dsn, connect):
        # A retried `schedules fire --idempotency-key K` (a timeout, a second terminal) returns
        # the run the first made; without the option every command is its own fire (a key of
        # its own).
        ok_json(cli("schedules", "add", "tick", "--deployment", "d", "--every", "3600",
                    "--json", dsn=database_dsn))
        first = ok_json(cli("schedules", "fire", "tick", "--idempotency-key", "deploy-42", "--json",
                            dsn=database_dsn))
        again = cli("schedules", "fire", "tick", "--idempotency-key", "deploy-42", dsn=database_dsn)
        assert again.returncode == 0, again.stderr
        assert f"already fired with key deploy-42: run {first['run_id']}" in again.stdout
        assert first["created"] is True
        conn = await connect()
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 1
        other = ok_json(cli("schedules", "fire", "tick", "--json", dsn=database_dsn))
        assert other["created"] is True
        assert other["idempotency_key"].startswith("cli-")
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 2
        bad = cli("schedules", "fire", "tick", "--idempotency-key", "k" * 201, dsn=database_dsn)
        assert bad.returncode != 0
        assert "idempotency_key" in bad.stderr
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 2
