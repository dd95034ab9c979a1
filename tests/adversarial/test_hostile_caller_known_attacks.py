"""The hostile caller's known attacks, replayed deterministically.

At its CI size (15 derandomized examples per function) the hypothesis search of
test_hostile_caller.py did not reach these attacks: with 150 random
examples per function it found them, but those draws are rare. This module replays them through
the same harness and the same invariant checker, every run: each fenced give-back
(release_lease, hand_back_to_pending, expire_recovery_lease) by the holder of an orphan lease
that an operator cleared (or that expired), and an interrupt / rollback admission naming the
owner of a live owned thread run by its worker id without its generation.
"""

from __future__ import annotations

from test_hostile_caller import VICTIMS, Hostile, check, hostile  # noqa: F401

ORPHANS = """SELECT r.run_id, r.tenant_id, r.workspace_id, r.lease_worker_id,
                    r.lease_generation FROM zeroth.runs r
              WHERE r.status = 'running' AND r.lease_expires_at < clock_timestamp()"""


def _scope(tenant: str, workspace: str | None) -> dict[str, str | None]:
    return {"tenant_id": None if tenant == "default" else tenant, "workspace_id": workspace}


def attacks(h: Hostile) -> list[tuple[str, dict]]:
    calls: list[tuple[str, dict]] = []
    for o in h.run(h.conn.fetch(ORPHANS)):
        for name in ("release_lease", "hand_back_to_pending", "expire_recovery_lease"):
            calls.append((name, {"run_id": o["run_id"], "worker_id": o["lease_worker_id"],
                                 "generation": o["lease_generation"],
                                 **_scope(o["tenant_id"], o["workspace_id"])}))
    for lease in h.seed.leases:
        if lease.worker_id != VICTIMS[2]:  # the owned, non-resumable thread runs
            continue
        tenant, wskey = lease.scope
        for strategy in ("interrupt", "rollback"):
            calls.append(("admit_run", {
                "deployment_ref": "d1", "thread_id": "t-1", "strategy": strategy,
                "worker_id": lease.worker_id,
                **_scope(tenant, None if wskey == "" else wskey.removeprefix("w:"))}))
    assert len(calls) >= 10
    return calls


def test_the_known_attacks_break_no_promise(hostile: Hostile) -> None:  # noqa: F811
    failures = []
    for name, args in attacks(hostile):
        function = hostile.functions[name]
        args = {k: v for k, v in args.items() if k in {p.name for p in function.parameters}}
        transaction = hostile.conn.transaction()
        hostile.run(transaction.start())
        try:
            before = hostile.state()
            result = hostile.call(function, args)
            after = hostile.state()
            try:
                check(hostile, function, args, result, before, after)
            except AssertionError as exc:
                failures.append(str(exc).splitlines()[0][:300])
        finally:
            hostile.run(transaction.rollback())
    assert not failures, "\n".join(failures)
