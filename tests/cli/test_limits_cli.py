"""``zeroth-pg limits set | rate`` (test_cli.cli: in process, one call as a subprocess): a
scope paused, limited and resumed through zeroth.set_scope_limits, a rate key through
zeroth.set_rate_limit, and a refused value (exit 2, nothing changed)."""

from __future__ import annotations

from test_cli import cli, ok_json


class TestLimitsCommand:
    async def test_rate_then_pause_limit_and_resume_a_scope(self, database_dsn, connect):
        key = ok_json(cli("limits", "rate", "smtp", "--max-starts", "10", "--per", "60",
                          "--json", dsn=database_dsn))
        assert key["created"] is True
        paused = ok_json(cli("limits", "set", "mail", "--tenant", "acme", "--pause",
                             "--max-concurrency", "3", "--rate-limit", "smtp", "--json",
                             dsn=database_dsn))
        assert (paused["paused"], paused["max_concurrency"], paused["rate_limit"]) == (
            True, 3, "smtp")
        resumed = ok_json(cli("limits", "set", "mail", "--tenant", "acme", "--resume",
                              "--max-concurrency", "0", "--json", dsn=database_dsn))
        assert (resumed["paused"], resumed["max_concurrency"], resumed["rate_limit"]) == (
            False, None, "smtp")
        table = cli("limits", "set", "mail", "--tenant", "acme", "--rate-limit", "",
                    dsn=database_dsn)
        assert table.returncode == 0, table.stderr
        assert "acme/-/mail: serving, max_concurrency none, weight 1, rate limit none" in (
            table.stdout)
        conn = await connect()
        row = await conn.fetchrow("SELECT paused, max_concurrency, rate_limit "
                                  "FROM zeroth.scope_limits")
        assert tuple(row) == (False, None, None)

    async def test_an_unknown_key_is_a_usage_error_and_changes_nothing(self, database_dsn,
                                                                       connect):
        result = cli("limits", "set", "mail", "--pause", "--rate-limit", "nope",
                     dsn=database_dsn, process=True)
        assert result.returncode == 2
        assert 'no rate limit named "nope"' in result.stderr
        conn = await connect()
        assert await conn.fetchval("SELECT count(*) FROM zeroth.scope_limits") == 0
