"""The scope page sets a deployment's timeouts and its code version policy (issue 34), over HTTP
against a real database: the attempt and run timeouts through the defaults form
(zeroth.set_deployment_defaults, audited in zeroth.deployment_changes; blank keeps, a checkbox sets
back to not set), the version policy through its own form (zeroth.set_version_policy, audited in
zeroth.code_version_changes). Each: done with actions enabled; bad input is a clear 400 and
changes nothing. Refused read-only, without the CSRF token, from a foreign Origin or Host, and
as a zeroth_reader: test_web_action_guards.py, with every action of the dashboard."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest
from helpers import dashboard

from zeroth_pg.web import create_app

URL = "/deployments/scope?deployment=mail&tenant=acme"
SCOPE = {"deployment": "mail", "tenant": "acme", "workspace": ""}


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token in the page"
    return found.group(1)


async def _registered(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                       "attempt_timeout_seconds => 60)")


async def _state(conn: asyncpg.Connection) -> dict[str, Any]:
    """Everything these forms could change."""
    return {
        "deployments": [tuple(r) for r in await conn.fetch(
            "SELECT deployment_ref, attempt_timeout_seconds, run_timeout_seconds, managed_by, "
            "version, version_policy, compatible_versions FROM zeroth.deployments "
            "ORDER BY deployment_ref")],
        "changes": await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes"),
        "version_changes": await conn.fetchval(
            "SELECT count(*) FROM zeroth.code_version_changes"),
    }


class TestTheFormsSetThem:
    async def test_the_timeouts_are_set_kept_and_unset_audited(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _registered(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(URL).text
                form = page[page.index('id="deployment-defaults-form"'):]
                assert 'name="attempt_timeout_seconds" inputmode="decimal" value="60"' in form
                r = client.post("/actions/deployment-defaults", data={
                    **SCOPE, "run_timeout_seconds": "7200", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(r.headers["location"]).text
                assert "done: defaults" in page
                shown = page[page.index('id="deployment-defaults"'):]
                assert "<dt>attempt timeout</dt><dd>60 s from each claim" in shown  # kept
                assert "<dt>run timeout</dt><dd>7200 s from the first claim" in shown
                r = client.post("/actions/deployment-defaults", data={
                    **SCOPE, "unset_attempt_timeout_seconds": "on", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(URL).text
                assert "<dt>attempt timeout</dt><dd><span class=\"muted\">not set</span>" in page
            assert tuple(await conn.fetchrow(
                "SELECT attempt_timeout_seconds, run_timeout_seconds, managed_by "
                "FROM zeroth.deployments WHERE deployment_ref = 'mail'")) == (None, 7200, "sql")
            assert [r["via"] for r in await conn.fetch(
                "SELECT via FROM zeroth.deployment_changes WHERE deployment_ref = 'mail' "
                "ORDER BY version")] == ["register_deployment", "set_deployment_defaults",
                                         "set_deployment_defaults"]
        finally:
            await conn.close()

    async def test_the_version_policy_is_set_and_audited(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _registered(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(URL).text
                assert 'id="version-policy-form"' in page
                r = client.post("/actions/version-policy", data={
                    **SCOPE, "version_policy": "compatible",
                    "compatible_versions": "v2,v1\n2026.12.05-abc", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(r.headers["location"]).text
                assert "done: version-policy" in page
                policy = page[page.index('id="version-policy"'):]
                assert "2026.12.05-abc, v1, v2" in policy
                r = client.post("/actions/version-policy", data={
                    **SCOPE, "version_policy": "same", "csrf": _csrf(page)},
                    follow_redirects=False)
                assert r.status_code == 303, r.text
                page = client.get(URL).text
                assert "same <span" in page[page.index('id="version-policy"'):]
            assert tuple(await conn.fetchrow(
                "SELECT version_policy, compatible_versions FROM zeroth.deployments "
                "WHERE deployment_ref = 'mail'")) == ("same", None)
            assert [tuple(r) for r in await conn.fetch(
                "SELECT action, version_policy FROM zeroth.code_version_changes "
                "ORDER BY change_id")] == [("set_policy", "compatible"), ("set_policy", "same")]
        finally:
            await conn.close()


class TestBadInput:
    @pytest.mark.parametrize(("path", "fields"), [
        ("/actions/deployment-defaults", {"attempt_timeout_seconds": "0"}),
        ("/actions/deployment-defaults", {"attempt_timeout_seconds": "0.5"}),
        ("/actions/deployment-defaults", {"attempt_timeout_seconds": "2592001"}),
        ("/actions/deployment-defaults", {"attempt_timeout_seconds": "nan"}),
        ("/actions/deployment-defaults", {"run_timeout_seconds": "inf"}),
        ("/actions/deployment-defaults", {"run_timeout_seconds": "31536001"}),
        ("/actions/deployment-defaults", {"run_timeout_seconds": "an hour"}),
        ("/actions/deployment-defaults", {"run_timeout_seconds": "60",
                                          "unset_run_timeout_seconds": "on"}),
        ("/actions/deployment-defaults", {"unset_attempt_timeout_seconds": "yes"}),
        ("/actions/version-policy", {"version_policy": "newest"}),
        ("/actions/version-policy", {}),
        ("/actions/version-policy", {"version_policy": "compatible"}),
        ("/actions/version-policy", {"version_policy": "compatible",
                                     "compatible_versions": "v1 -bad"}),
        ("/actions/version-policy", {"version_policy": "compatible",
                                     "compatible_versions": "v" + "1" * 128}),
        ("/actions/version-policy", {"version_policy": "compatible",
                                     "compatible_versions": " ".join(
                                         f"v{i}" for i in range(101))}),
        ("/actions/version-policy", {"version_policy": "same", "compatible_versions": "v1"}),
        ("/actions/version-policy", {"version_policy": "any", "deployment": ""}),
        # refused by the database: a deployment nobody registered
        ("/actions/version-policy", {"version_policy": "same", "deployment": "unknown"}),
    ])
    async def test_bad_input_is_refused_clearly_and_changes_nothing(self, database_dsn, path,
                                                                    fields):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _registered(conn)
            before = await _state(conn)
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                csrf = _csrf(client.get(URL).text)
                r = client.post(path, data={**SCOPE, **fields, "csrf": csrf})
            assert r.status_code == 400, r.text
            assert "bad input" in r.text
            assert await _state(conn) == before
        finally:
            await conn.close()


class TestTheDefaultsFormKeepsWhatItShows:
    async def test_resubmitting_the_form_as_shown_changes_no_timeout_nor_retry_policy(
            self, database_dsn):
        # The form is pre-filled with the current values, so a DBA changing one field submits
        # every other as shown. Shown with '%g' (6 significant digits), a run timeout of
        # 2,000,001 s came back as 2e+06, an attempt timeout of 1.2345678 s as 1.23457: set anew,
        # and audited, though nobody touched them.
        conn = await asyncpg.connect(database_dsn)
        try:
            await conn.execute(
                "SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                "attempt_timeout_seconds => 1.2345678, run_timeout_seconds => 2000001, "
                "retry_base_seconds => 1.0000001, retry_max_seconds => 2592000, "
                "lease_seconds => 30.1234567)")
            before = tuple(await conn.fetchrow(
                "SELECT attempt_timeout_seconds, run_timeout_seconds, retry_base_seconds, "
                "retry_max_seconds, lease_seconds FROM zeroth.deployments "
                "WHERE deployment_ref = 'mail'"))
            with dashboard(create_app(database_dsn, enable_actions=True)) as client:
                page = client.get(URL).text
                form = page[page.index('id="deployment-defaults-form"'):]
                form = form[:form.index("</form>")]
                shown = dict(re.findall(r'<input name="([a-z_]+)"[^>]*? value="([^"]*)"', form))
                assert {"run_timeout_seconds", "attempt_timeout_seconds", "retry_base_seconds",
                        "retry_max_seconds", "lease_seconds"} <= set(shown)
                shown["priority"] = "5"  # the one field the DBA changes
                r = client.post("/actions/deployment-defaults",
                                data={**SCOPE, **shown, "csrf": _csrf(page)},
                                follow_redirects=False)
                assert r.status_code == 303, r.text
            assert await conn.fetchval(
                "SELECT priority FROM zeroth.deployments WHERE deployment_ref = 'mail'") == 5
            assert tuple(await conn.fetchrow(
                "SELECT attempt_timeout_seconds, run_timeout_seconds, retry_base_seconds, "
                "retry_max_seconds, lease_seconds FROM zeroth.deployments "
                "WHERE deployment_ref = 'mail'")) == before
        finally:
            await conn.close()
