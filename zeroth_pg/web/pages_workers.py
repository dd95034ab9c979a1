"""The workers page, from the database's view of them: every worker id that holds a lease
(zeroth.runs' lease columns: live, or expired — its worker stopped renewing) or ended an attempt
of a run finished in the last hour (zeroth.run_attempts), each called

- **live**: it holds a live lease;
- **expired**: its only leases expired (the worker is gone or stalled; the orphan sweep takes
  them);
- **idle**: no lease, and a session of it is connected (``zeroth-worker:<id>`` or
  ``zeroth-listener:<id>`` in pg_stat_activity; shown only to a role that reads every tenant);
- **gone**: no lease and no session (or, to a one-tenant reader, no lease: ``idle or gone``),
  with when it was last seen ending an attempt.

Its leases are listed with the run, the deployment and the time left."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from zeroth_pg.web._shared import Context

__all__ = ["routes", "worker_states"]

#: How far back an ended attempt makes a worker "recently seen", and how many finished runs'
#: attempts are read for it (newest first, through runs_finished_idx).
RECENT = "1 hour"
RECENT_RUNS = 5000
LEASES_SHOWN = 500

# Every lease a run holds, live or expired (runs_claim_pending_idx / runs_running_idx: only
# pending and running runs hold one).
_LEASES = f"""SELECT r.lease_worker_id AS worker_id, r.run_id, r.tenant_id, r.workspace_id,
           r.deployment_ref, r.status::text AS status, r.lease_generation, r.lease_acquired_at,
           r.lease_expires_at,
           EXTRACT(epoch FROM r.lease_expires_at - clock_timestamp())::double precision
               AS seconds_left
      FROM zeroth.runs r
     WHERE r.status IN ('pending', 'running') AND r.lease_worker_id IS NOT NULL
     ORDER BY r.lease_worker_id, r.lease_expires_at
     LIMIT {LEASES_SHOWN + 1}"""

# The attempts of the runs finished in the last hour, per worker: when each was last seen ending
# one, and how (runs_finished_idx, then per run the view zeroth.run_attempts: run_attempts_run_idx
# of its log and, for a completion at the first claim, the run's own row by runs_pkey).
_RECENT = f"""SELECT a.worker_id, count(*) AS attempts, max(a.ended_at) AS last_seen,
           count(*) FILTER (WHERE a.outcome IN ('failed', 'dead_lettered')) AS failed,
           count(*) FILTER (WHERE a.outcome IN ('recovered', 'expired', 'lease_lost'))
               AS lost
      FROM (SELECT f.tenant_id, f.workspace_key, f.run_id
              FROM zeroth.runs f
             WHERE f.status IN ('completed', 'failed', 'cancelled')
               AND f.finished_at >= clock_timestamp() - interval '{RECENT}'
             ORDER BY f.finished_at DESC
             LIMIT {RECENT_RUNS}) f
      JOIN zeroth.run_attempts a
        ON a.tenant_id = f.tenant_id AND a.workspace_key = f.workspace_key
       AND a.run_id = f.run_id
     WHERE a.ended_at >= clock_timestamp() - interval '{RECENT}'
     GROUP BY a.worker_id"""

# pg_stat_activity shows every session's application_name to any role, so the sessions are
# listed only to a role that reads every tenant (not one filtered by zeroth_reader's row-level
# security): a worker's application name carries its worker id.
_SEES_EVERY_TENANT = """SELECT r.rolsuper OR r.rolbypassrls
           OR pg_has_role(current_user, 'zeroth_owner', 'USAGE')
           OR NOT pg_has_role(current_user, 'zeroth_reader', 'USAGE')
      FROM pg_roles r WHERE r.rolname = current_user"""

_LISTENERS = """SELECT application_name, count(*) AS sessions FROM pg_stat_activity
     WHERE application_name <> '' AND datname = current_database()
     GROUP BY application_name ORDER BY application_name"""

_SESSION_PREFIXES = ("zeroth-worker:", "zeroth-listener:")


def worker_states(leases: list[Any], recent: list[Any],
                  connected: set[str] | None) -> list[dict[str, Any]]:
    """One row per worker id: its state (live, expired, idle, gone, or ``idle or gone`` when the
    sessions are not visible), its live and expired lease counts and when it was last seen."""
    workers: dict[str, dict[str, Any]] = {}

    def entry(worker_id: str) -> dict[str, Any]:
        return workers.setdefault(worker_id, {
            "worker_id": worker_id, "live": 0, "expired": 0, "last_acquired": None,
            "next_expiry": None, "attempts": 0, "failed": 0, "lost": 0, "last_seen": None})

    for lease in leases:
        w = entry(lease["worker_id"])
        if lease["seconds_left"] >= 0:
            w["live"] += 1
            expiry = lease["lease_expires_at"]
            w["next_expiry"] = expiry if w["next_expiry"] is None else min(w["next_expiry"],
                                                                             expiry)
        else:
            w["expired"] += 1
        acquired = lease["lease_acquired_at"]
        if acquired is not None and (w["last_acquired"] is None or acquired > w["last_acquired"]):
            w["last_acquired"] = acquired
    for row in recent:
        w = entry(row["worker_id"])
        w.update(attempts=row["attempts"], failed=row["failed"], lost=row["lost"],
                 last_seen=row["last_seen"])
    for w in workers.values():
        if w["live"]:
            w["state"] = "live"
        elif w["expired"]:
            w["state"] = "expired"
        elif connected is None:
            w["state"] = "idle or gone"
        else:
            w["state"] = "idle" if w["worker_id"] in connected else "gone"
    # Connected workers that hold nothing and ended nothing lately: idle.
    for worker_id in sorted(connected or ()):
        if worker_id not in workers:
            entry(worker_id)["state"] = "idle"
    order = {"live": 0, "expired": 1, "idle": 2, "idle or gone": 3, "gone": 4}
    return sorted(workers.values(), key=lambda w: (order[w["state"]], w["worker_id"]))


def routes(ctx: Context) -> list[Route]:
    async def workers(request: Request) -> Response:
        async with ctx.pool().acquire() as conn:
            leases = await conn.fetch(_LEASES)
            recent = await conn.fetch(_RECENT)
            every_tenant = bool(await conn.fetchval(_SEES_EVERY_TENANT))
            listeners = await conn.fetch(_LISTENERS) if every_tenant else None
        connected = None
        if listeners is not None:
            connected = {name.split(":", 1)[1] for name in
                         (row["application_name"] for row in listeners)
                         if name.startswith(_SESSION_PREFIXES)}
        shown = list(leases[:LEASES_SHOWN])
        return ctx.render(request, "workers.html", workers=worker_states(shown, recent, connected),
                          leases=shown, more=len(leases) > LEASES_SHOWN, listeners=listeners,
                          recent=RECENT)

    return [Route("/workers", workers)]
