"""What NOTIFY and LISTEN give a role with no grant at all (findings 2 and 3).

Anyone who can connect may LISTEN on any channel and NOTIFY any payload. On main before the fix a
stranger heard every tenant's deployment, tenant and workspace names on zeroth_wakeup, run ids,
thread ids and statuses on zeroth_run_finished, and worker ids and generations on zeroth_control,
and a forged zeroth_control payload made a worker cancel its own live run. Now every payload is
an opaque key (32 hex digits of sha256 over a per-database secret), and a worker treats a
notification as a question to the database (tests/integration/test_worker_cancel_notifications.py
runs the forged cancel against a real worker).
"""

from __future__ import annotations

import asyncio
import re

import asyncpg
import pytest
from helpers import announce_idle

from zeroth_pg import migrate

CHANNELS = ("zeroth_wakeup", "zeroth_control", "zeroth_run_finished", "zeroth_run_events")
SECRETS = ("acme", "ws-9", "secret-deploy", "thread-secret", "worker-secret", "secret-event")


async def listen_all(conn: asyncpg.Connection) -> asyncio.Queue[tuple[str, str]]:
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    for channel in CHANNELS:
        await conn.add_listener(
            channel, lambda _c, _p, ch, payload: queue.put_nowait((ch, payload)))
    return queue


async def drain(queue: asyncio.Queue[tuple[str, str]], sender: asyncpg.Connection
                ) -> list[tuple[str, str]]:
    """Everything heard before a marker sent in a later transaction (commit order)."""
    await sender.execute("SELECT pg_notify('zeroth_wakeup', 'marker')")
    heard = []
    while (item := await asyncio.wait_for(queue.get(), timeout=10)) != ("zeroth_wakeup", "marker"):
        heard.append(item)
    return heard


class TestAStrangerListening:
    async def test_hears_only_opaque_keys_of_every_channel(self, login):
        stranger = await login("nobody")
        heard = await listen_all(stranger)
        worker = await login("worker")
        # An idle worker of the scope (writers notify only while one waits for work).
        assert len(await announce_idle(await login("worker"), "secret-deploy", "acme", "ws-9")) == 8
        scope = "tenant_id => 'acme', workspace_id => 'ws-9'"
        # Work made claimable (wakeup), an owned thread run asked to stop (control), its end
        # (run finished), and the wakeup of the slot and thread it freed.
        await worker.execute(
            f"SELECT zeroth.enqueue_run(deployment_ref => 'secret-deploy', {scope})")
        admitted = await worker.fetchrow(
            f"""SELECT run_id, lease_generation FROM zeroth.admit_run(
                    deployment_ref => 'secret-deploy', thread_id => 'thread-secret',
                    worker_id => 'worker-secret', {scope})""")
        fence = (admitted["run_id"], admitted["lease_generation"])
        assert await worker.fetchval(
            f"""SELECT zeroth.start_run(run_id => $1, worker_id => 'worker-secret',
                    generation => $2, {scope})""", *fence)
        # An event of the run's stream (run events; its END notifies the same key).
        assert await worker.fetchval(
            f"""SELECT zeroth.append_run_event(run_id => $1, worker_id => 'worker-secret',
                    generation => $2, name => 'secret-event', data => '"secret"', {scope})""",
            *fence) == 1
        assert await worker.fetchval(
            f"SELECT zeroth.request_cancel(run_id => $1, {scope})", fence[0]) == "cancel_requested"
        assert await worker.fetchval(
            f"""SELECT zeroth.cancel_run(run_id => $1, worker_id => 'worker-secret',
                    generation => $2, {scope})""", *fence)

        received = await drain(heard, worker)

        assert {channel for channel, _ in received} == set(CHANNELS)
        for channel, payload in received:
            assert re.fullmatch(r"[0-9a-f]{32}", payload), (channel, payload)
            assert not any(secret in payload for secret in SECRETS)
        # ... and what they are is only known to those who may ask the database.
        assert set(received) == {
            ("zeroth_wakeup", await worker.fetchval(
                "SELECT zeroth.wakeup_key('secret-deploy', 'acme', 'ws-9')")),
            ("zeroth_control", await worker.fetchval("SELECT zeroth.control_key('worker-secret')")),
            ("zeroth_run_finished", await worker.fetchval(
                "SELECT zeroth.run_finished_key($1, 'acme', 'ws-9')", fence[0])),
            ("zeroth_run_events", await worker.fetchval(
                "SELECT zeroth.run_events_key($1, 'acme', 'ws-9')", fence[0])),
        }

    async def test_cannot_compute_a_key_for_a_scope_it_guesses(self, login, admin):
        stranger = await login("nobody")
        for statement in ("SELECT zeroth.wakeup_key('secret-deploy', 'acme', 'ws-9')",
                          "SELECT zeroth.control_key('worker-secret')",
                          "SELECT secret FROM zeroth.notification_secret"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await stranger.fetchval(statement)
        # A key is not a hash of the guessable name: without the secret it cannot be rebuilt.
        key = await admin.fetchval("SELECT zeroth.wakeup_key('secret-deploy', 'acme', 'ws-9')")
        guesses = await admin.fetchval(
            """SELECT array_agg(left(encode(sha256(convert_to(g, 'UTF8')), 'hex'), 32))
                 FROM unnest(ARRAY['secret-deploy', 'acme|ws-9|secret-deploy',
                                   'wakeup' || chr(31) || 'acme' || chr(31) || 'ws-9'
                                   || chr(31) || 'secret-deploy']) AS g""")
        assert key not in guesses

    async def test_no_separator_inside_a_name_makes_two_subjects_share_a_key(self, admin):
        """A key is not the hash of the subject joined with chr(31) and NULL as chr(30): the
        workspace NULL and a workspace named chr(30) (or names that move a separator between
        them) would share a key."""
        pairs = [
            (("d", "acme", None), ("d", "acme", chr(30))),
            (("d", "a" + chr(31) + "b", None), ("d", "a", "b")),
            (("d", "acme", "NULL"), ("d", "acme", None)),
            (("d" + chr(31) + "acme", "x", None), ("d", "acme" + chr(31) + "x", None)),
        ]
        for left, right in pairs:
            keys = [await admin.fetchval(
                "SELECT zeroth.wakeup_key(deployment_ref => $1, tenant_id => $2, "
                "workspace_id => $3)", *subject) for subject in (left, right)]
            assert keys[0] != keys[1], (left, right)

    async def test_keys_differ_per_installation(self, admin, empty_database_dsn):
        # Every install draws its own secret: a key heard on one database means nothing on
        # another. (A database cloned with CREATE DATABASE ... TEMPLATE copies its secret like
        # any other row; docs/security.md says to rotate it then.)
        await asyncio.to_thread(migrate.upgrade, empty_database_dsn)
        other = await asyncpg.connect(empty_database_dsn)
        try:
            here = await admin.fetchval("SELECT zeroth.wakeup_key('d', 'acme', NULL)")
            there = await other.fetchval("SELECT zeroth.wakeup_key('d', 'acme', NULL)")
        finally:
            await other.close()
        assert here != there


class TestAStrangerNotifying:
    async def test_may_notify_any_channel_and_changes_nothing(self, login, admin):
        # NOTIFY needs no privilege: this is why a notification can only ever be a hint.
        worker = await login("worker")
        run_id = await worker.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd')")
        assert await worker.fetchval(
            "SELECT lease_generation FROM zeroth.claim_and_start(deployment_ref => 'd', "
            "worker_id => 'victim')") == 1
        before = await admin.fetchrow("SELECT r::text AS whole FROM zeroth.runs r")
        stranger = await login("nobody")
        control = await worker.fetchval("SELECT zeroth.control_key('victim')")
        for channel, payload in (
                ("zeroth_control", control),
                ("zeroth_control", f'{{"type": "cancel", "run_id": "{run_id}", '
                                   '"worker_id": "victim", "lease_generation": 1}'),
                ("zeroth_wakeup", "x" * 7999)):
            await stranger.execute("SELECT pg_notify($1, $2)", channel, payload)
        assert await admin.fetchrow("SELECT r::text AS whole FROM zeroth.runs r") == before
