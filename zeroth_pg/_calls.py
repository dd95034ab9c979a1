"""Every SQL statement the client sends, in one place: one call per zeroth.* function, and at
the end the operator reads of the ``zeroth-pg`` command (views and tables).

Functions are called with named notation so that a new optional parameter on the SQL side never
shifts an argument. JSON goes in as text cast to jsonb and comes back as text, so the client works
whatever jsonb codec the caller's pool has. Composite results are selected column by column
(asyncpg caches composite codecs; a changed type would break a cached ``SELECT *``).
"""

from __future__ import annotations

_CLAIM_COLUMNS = """run_id, lease_generation, lease_expires_at, status::text AS status, attempts,
    max_attempts, priority, thread_id, idempotency_key, payload::text AS payload,
    metadata::text AS metadata, recovery_checkpoint_id, checkpoint_data::text AS checkpoint_data,
    cancel_requested, active_count, concurrency_saturated, concurrency_limit, retry_at,
    retry_after, deadline_at, deadline_in"""

ENQUEUE_RUN = """SELECT run_id, created, status::text AS status FROM zeroth.enqueue_run(
    deployment_ref => $1, payload => $2::text::jsonb, tenant_id => $3, workspace_id => $4,
    priority => $5, run_after => $6, max_attempts => $7, idempotency_key => $8,
    metadata => $9::text::jsonb, run_id => $10, thread_id => $11,
    attempt_timeout_seconds => $12, run_timeout_seconds => $13)"""

ENQUEUE_RUNS = """SELECT run_id, created, status::text AS status FROM zeroth.enqueue_runs(
    deployment_ref => $1, runs => $2::text::jsonb, tenant_id => $3, workspace_id => $4)
    ORDER BY ordinality"""

CLAIM_PENDING = f"""SELECT {_CLAIM_COLUMNS} FROM zeroth.claim_pending(
    deployment_ref => $1, worker_id => $2, tenant_id => $3, workspace_id => $4,
    max_concurrency => $5, batch_size => $6, lease_seconds => $7, code_version => $8)"""

CLAIM_AND_START = f"""SELECT {_CLAIM_COLUMNS} FROM zeroth.claim_and_start(
    deployment_ref => $1, worker_id => $2, tenant_id => $3, workspace_id => $4,
    max_concurrency => $5, batch_size => $6, lease_seconds => $7, code_version => $8)"""

CLAIM_AND_START_SCOPES = f"""SELECT tenant_id, workspace_id, deployment_ref, {_CLAIM_COLUMNS}
    FROM zeroth.claim_and_start_scopes(deployment_refs => $1::text[], worker_id => $2,
    tenant_ids => $3::text[], workspace_ids => $4::text[], max_concurrency => $5,
    batch_size => $6, lease_seconds => $7, code_version => $8)"""

CLAIM_ORPHANED_SCOPES = f"""SELECT tenant_id, workspace_id, deployment_ref, {_CLAIM_COLUMNS}
    FROM zeroth.claim_orphaned_scopes(deployment_refs => $1::text[], worker_id => $2,
    tenant_ids => $3::text[], workspace_ids => $4::text[], max_concurrency => $5,
    claim_limit => $6, lease_seconds => $7, grace_seconds => $8, code_version => $9)"""

CLAIM_ORPHANED = f"""SELECT {_CLAIM_COLUMNS} FROM zeroth.claim_orphaned(
    deployment_ref => $1, worker_id => $2, tenant_id => $3, workspace_id => $4,
    max_concurrency => $5, claim_limit => $6, lease_seconds => $7, grace_seconds => $8,
    code_version => $9)"""

SET_RATE_LIMIT = """SELECT zeroth.set_rate_limit(name => $1, max_starts => $2,
    period_seconds => $3, note => $4)"""

SET_SCOPE_LIMITS = """SELECT tenant_id, workspace_id, deployment_ref, max_concurrency, weight,
    paused, note, rate_limit FROM zeroth.set_scope_limits(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3, paused => $4, max_concurrency => $5, weight => $6, rate_limit => $7,
    note => $8)"""

RENEW_LEASE = """SELECT zeroth.renew_lease(run_id => $1, worker_id => $2, generation => $3,
    tenant_id => $4, workspace_id => $5, lease_seconds => $6)"""

RENEW_LEASES = """SELECT run_id, renewed, lease_expires_at, cancel_requested, sqlstate
    FROM zeroth.renew_leases(worker_id => $1, run_ids => $2, generations => $3,
    tenant_id => $4, workspace_id => $5, lease_seconds => $6)"""

CURRENT_GENERATION = """SELECT zeroth.current_generation(run_id => $1, tenant_id => $2,
    workspace_id => $3)"""

CURRENT_HOLDER = """SELECT zeroth.current_holder(run_id => $1, tenant_id => $2,
    workspace_id => $3)"""

GET_RECOVERY_CHECKPOINT_ID = """SELECT zeroth.get_recovery_checkpoint_id(run_id => $1,
    tenant_id => $2, workspace_id => $3)"""

COMMIT_FENCED = """SELECT zeroth.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
    columns => $4::text::jsonb, tenant_id => $5, workspace_id => $6)"""

START_RUN = """SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3,
    tenant_id => $4, workspace_id => $5, code_version => $6)"""

SAVE_CHECKPOINT = """SELECT zeroth.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
    data => $4::text::jsonb, checkpoint_id => $5, tenant_id => $6, workspace_id => $7)"""

COMPLETE_RUN = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
    output => $4::text::jsonb, tenant_id => $5, workspace_id => $6)"""

COMPLETE_RUNS = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1,
    run_ids => $2, generations => $3, outputs => $4::text[]::jsonb[], tenant_id => $5,
    workspace_id => $6)"""

# The claim rows' fields are expanded server-side (asyncpg caches composite codecs: see above).
COMPLETE_AND_CLAIM = f"""SELECT x.completed, {_CLAIM_COLUMNS}
    FROM zeroth.complete_and_claim(deployment_ref => $1, worker_id => $2, run_ids => $3,
    generations => $4, outputs => $5::text[]::jsonb[], tenant_id => $6, workspace_id => $7,
    max_concurrency => $8, batch_size => $9, lease_seconds => $10, code_version => $11) AS x
    CROSS JOIN LATERAL (SELECT (x.claimed).*) AS c"""

SETTLE_RUNS = """SELECT run_id, outcome, sqlstate FROM zeroth.settle_runs(worker_id => $1,
    run_ids => $2, generations => $3, outcomes => $4, outputs => $5::text[]::jsonb[],
    errors => $6::text[]::jsonb[], retry_base_seconds => $7, retry_max_seconds => $8,
    tenant_id => $9, workspace_id => $10)"""

FAIL_RUN = """SELECT zeroth.fail_run(run_id => $1, worker_id => $2, generation => $3,
    error => $4::text::jsonb, retryable => $5, retry_base_seconds => $6,
    retry_max_seconds => $7, tenant_id => $8, workspace_id => $9)"""

CANCEL_RUN = """SELECT zeroth.cancel_run(run_id => $1, worker_id => $2, generation => $3,
    tenant_id => $4, workspace_id => $5)"""

PAUSE_RUN = """SELECT zeroth.pause_run(run_id => $1, worker_id => $2, generation => $3,
    reason => $4, tenant_id => $5, workspace_id => $6)"""

SLEEP_RUN = """SELECT outcome, run_after, checkpoint_id FROM zeroth.sleep_run(run_id => $1,
    worker_id => $2, generation => $3, resume_at => $4, delay_seconds => $5,
    checkpoint => $6::text::jsonb, tenant_id => $7, workspace_id => $8)"""

GET_STEP = """SELECT step_found, result::text AS result FROM zeroth.get_step(run_id => $1,
    worker_id => $2, generation => $3, step_key => $4, tenant_id => $5, workspace_id => $6)"""

RECORD_STEP = """SELECT recorded, recorded_result::text AS recorded_result FROM zeroth.record_step(
    run_id => $1, worker_id => $2, generation => $3, step_key => $4, result => $5::text::jsonb,
    tenant_id => $6, workspace_id => $7)"""

WAIT_FOR_EVENT = """SELECT outcome, payload::text AS payload, timeout_at FROM zeroth.wait_for_event(
    run_id => $1, worker_id => $2, generation => $3, step_key => $4, name => $5,
    timeout_seconds => $6, tenant_id => $7, workspace_id => $8)"""

EMIT_EVENT = """SELECT emitted, woken FROM zeroth.emit_event(name => $1, payload => $2::text::jsonb,
    tenant_id => $3, workspace_id => $4)"""

WAKE_DUE_WAITS = """SELECT zeroth.wake_due_waits(deployment_refs => $1::text[], batch_size => $2)"""

START_CHILD_RUN = """SELECT child_run_id, created FROM zeroth.start_child_run(run_id => $1,
    worker_id => $2, generation => $3, step_key => $4, deployment_ref => $5,
    payload => $6::text::jsonb, priority => $7, max_attempts => $8, metadata => $9::text::jsonb,
    detached => $10, tenant_id => $11, workspace_id => $12)"""

WAIT_FOR_CHILDREN = """SELECT outcome, children::text AS children FROM zeroth.wait_for_children(
    run_id => $1, worker_id => $2, generation => $3, step_key => $4,
    child_run_ids => $5::uuid[], mode => $6, tenant_id => $7, workspace_id => $8)"""

RELEASE_LEASE = """SELECT zeroth.release_lease(run_id => $1, worker_id => $2, generation => $3,
    tenant_id => $4, workspace_id => $5)"""

HAND_BACK_TO_PENDING = """SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => $2,
    generation => $3, tenant_id => $4, workspace_id => $5)"""

EXPIRE_RECOVERY_LEASE = """SELECT zeroth.expire_recovery_lease(run_id => $1, worker_id => $2,
    generation => $3, tenant_id => $4, workspace_id => $5)"""

CLEAR_LEASE = """SELECT zeroth.clear_lease(run_id => $1, tenant_id => $2, workspace_id => $3)"""

REQUEST_CANCEL = """SELECT zeroth.request_cancel(run_id => $1, tenant_id => $2,
    workspace_id => $3, action => $4)"""

RESUME_RUN = """SELECT zeroth.resume_run(run_id => $1, tenant_id => $2, workspace_id => $3,
    input => $4::text::jsonb)"""

REDRIVE_RUN = """SELECT zeroth.redrive_run(run_id => $1, tenant_id => $2, workspace_id => $3)"""

PRUNE_RUNS = """SELECT zeroth.prune_runs(older_than => $1, batch_size => $2, tenant_id => $3,
    workspace_id => $4)"""

COUNT_PENDING = """SELECT zeroth.count_pending(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3)"""

COUNT_PENDING_SCOPES = """SELECT deployment_ref, pending FROM zeroth.count_pending_scopes(
    deployment_refs => $1::text[], tenant_ids => $2::text[], workspace_ids => $3::text[])"""

WAKEUP_KEY = """SELECT zeroth.wakeup_key(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3)"""

CONTROL_KEY = """SELECT zeroth.control_key(worker_id => $1)"""

ANNOUNCE_IDLE = """SELECT zeroth.announce_idle(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3)"""

ANNOUNCE_BUSY = """SELECT zeroth.announce_busy(deployment_ref => $1, tenant_id => $2,
    workspace_id => $3)"""

DEPLOYMENT_WAKEUP_KEY = "SELECT zeroth.deployment_wakeup_key(deployment_ref => $1)"

ANNOUNCE_IDLE_DEPLOYMENT = "SELECT zeroth.announce_idle_deployment(deployment_ref => $1)"

ANNOUNCE_BUSY_DEPLOYMENT = "SELECT zeroth.announce_busy_deployment(deployment_ref => $1)"

RUN_FINISHED_KEY = """SELECT zeroth.run_finished_key(run_id => $1, tenant_id => $2,
    workspace_id => $3)"""

# -- threads (sql/migrations/0004_threads.sql) ---------------------------------------------------

_THREAD_RUN_COLUMNS = """run_id, thread_id, deployment_ref, status::text AS status, queued,
    wait_reason, attempts, max_attempts, resumable, created_at, started_at, finished_at,
    updated_at, lease_worker_id, lease_generation, lease_expires_at, cancel_action,
    cancel_requested_at, idempotency_key, payload::text AS payload, metadata::text AS metadata,
    output::text AS output, error::text AS error, progress::text AS progress,
    accounting::text AS accounting"""

_TAKEOVER_COLUMNS = """run_id, thread_id, outcome, status::text AS status, previous_worker_id,
    previous_generation"""

ADMIT_RUN = """SELECT outcome, run_id, status::text AS status, lease_generation, lease_expires_at,
    active_run_id, retry_after_s, displaced::text AS displaced FROM zeroth.admit_run(
    deployment_ref => $1, thread_id => $2, strategy => $3, worker_id => $4,
    payload => $5::text::jsonb, tenant_id => $6, workspace_id => $7, lease_seconds => $8,
    grace_seconds => $9, idempotency_key => $10, metadata => $11::text::jsonb, run_id => $12,
    priority => $13, max_attempts => $14, resumable => $15, owner_generation => $16,
    code_version => $17)"""

REQUEST_CANCEL_V2 = """SELECT outcome, run_id, status::text AS status, cancel_action,
    lease_worker_id, lease_generation, retry_after_s FROM zeroth.request_cancel_v2(
    run_id => $1, tenant_id => $2, workspace_id => $3, action => $4, grace_seconds => $5)"""

CLAIM_FOR_TAKEOVER = f"""SELECT {_TAKEOVER_COLUMNS} FROM zeroth.claim_for_takeover(
    run_id => $1, tenant_id => $2, workspace_id => $3, grace_seconds => $4, stop_reason => $5,
    message => $6)"""

RECONCILE_THREAD_RUNS = f"""SELECT {_TAKEOVER_COLUMNS} FROM zeroth.reconcile_thread_runs(
    deployment_ref => $1, tenant_id => $2, workspace_id => $3, grace_seconds => $4,
    claim_limit => $5, stop_reason => $6, message => $7)"""

# -- run event stream (issue 34, item 1) ---------------------------------------------------------

APPEND_RUN_EVENT = """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2,
    generation => $3, name => $4, data => $5::text::jsonb, tenant_id => $6, workspace_id => $7,
    notify => $8)"""

READ_RUN_EVENTS = """SELECT event_id, kind, name, data::text AS data, lease_generation, created_at
    FROM zeroth.read_run_events(run_id => $1, after => $2, max_events => $3, tenant_id => $4,
                                workspace_id => $5)"""

RUN_EVENTS_KEY = """SELECT zeroth.run_events_key(run_id => $1, tenant_id => $2,
    workspace_id => $3)"""

# A zeroth_reader's read of a run's stream (it may execute no function): the run and its last
# event, then the events after $4 up to that one, in one snapshot (the caller's REPEATABLE READ
# transaction), under the reader's row-level security. zeroth_pg.streams.reader_events makes
# END from them as zeroth.read_run_events does.
READER_RUN_TAIL = """SELECT r.status::text AS status, r.dead_lettered_at IS NOT NULL AS dead,
           r.finished_at, r.lease_generation, l.event_id AS last_id, l.kind AS last_kind
      FROM zeroth.runs r
      LEFT JOIN LATERAL (
            SELECT e.event_id, e.kind FROM zeroth.run_events e
             WHERE e.tenant_id = r.tenant_id AND e.workspace_key = r.workspace_key
               AND e.run_id = r.run_id
             ORDER BY e.event_id DESC LIMIT 1) l ON true
     WHERE r.tenant_id = $1 AND r.workspace_key = $2 AND r.run_id = $3"""

READER_RUN_EVENTS = """SELECT e.event_id, e.kind, e.name, e.data::text AS data, e.lease_generation,
           e.created_at
      FROM zeroth.run_events e
     WHERE e.tenant_id = $1 AND e.workspace_key = $2 AND e.run_id = $3
       AND e.event_id > $4 AND e.event_id <= $5
     ORDER BY e.event_id LIMIT $6"""

UPDATE_RUN_PROGRESS = """SELECT zeroth.update_run_progress(run_id => $1, worker_id => $2,
    generation => $3, progress => $4::text::jsonb, accounting => $5::text::jsonb,
    tenant_id => $6, workspace_id => $7)"""

LIST_THREAD_RUNS = f"""SELECT {_THREAD_RUN_COLUMNS} FROM zeroth.list_thread_runs(
    thread_id => $1, tenant_id => $2, workspace_id => $3, max_runs => $4)"""

GET_THREAD_RUN = f"""SELECT {_THREAD_RUN_COLUMNS} FROM zeroth.get_thread_run(run_id => $1,
    tenant_id => $2, workspace_id => $3)"""

# -- the registry of deployments (0019_day_one.sql) ----------------------------------------------

_REGISTRATION = """outcome, deployment_ref, max_attempts, priority, managed_by, version,
    previous::text AS previous, retry_base_seconds, retry_max_seconds, lease_seconds,
    attempt_timeout_seconds, run_timeout_seconds"""

REGISTER_DEPLOYMENT = f"""SELECT {_REGISTRATION} FROM zeroth.register_deployment(
    deployment_ref => $1, max_attempts => $2, priority => $3, retry_base_seconds => $4,
    retry_max_seconds => $5, lease_seconds => $6, attempt_timeout_seconds => $7,
    run_timeout_seconds => $8)"""

SET_DEPLOYMENT_DEFAULTS = f"""SELECT {_REGISTRATION} FROM zeroth.set_deployment_defaults(
    deployment_ref => $1, max_attempts => $2, priority => $3, managed_by => $4,
    retry_base_seconds => $5, retry_max_seconds => $6, lease_seconds => $7, unset => $8,
    attempt_timeout_seconds => $9, run_timeout_seconds => $10)"""

LIST_DEPLOYMENTS = """SELECT deployment_ref, max_attempts, priority, managed_by, version,
    created_at, updated_at, updated_by, retry_base_seconds, retry_max_seconds, lease_seconds,
    attempt_timeout_seconds, run_timeout_seconds
    FROM zeroth.list_deployments(deployment_ref => $1)"""

# -- code versions (issue 34, item 3)

SET_VERSION_POLICY = """SELECT outcome, policy, versions FROM zeroth.set_version_policy(
    deployment_ref => $1, version_policy => $2, compatible_versions => $3)"""

RETIRE_CODE_VERSION = """SELECT runs_changed, runs_left FROM zeroth.retire_code_version(
    deployment_ref => $1, code_version => $2, action => $3, to_version => $4, message => $5)"""

PINNED_RUNS = """SELECT p.tenant_id, p.workspace_id, p.deployment_ref, p.code_version,
    p.version_policy, p.pending, p.running, p.waiting, p.waiting_for_version, p.oldest_pending_at
    FROM zeroth.pinned_runs p
    WHERE ($1::text IS NULL OR p.deployment_ref = $1) AND ($2::text IS NULL OR p.tenant_id = $2)
      AND ($3::text IS NULL OR p.workspace_id = $3)
    ORDER BY p.deployment_ref, p.code_version, p.tenant_id, p.workspace_id NULLS FIRST"""

# -- operator reads of the zeroth-pg command (zeroth_pg/cli): views and tables; its writes go
#    through LeaseManager

_RUN_COLUMNS = """r.run_id, r.tenant_id, r.workspace_id, r.deployment_ref, r.thread_id,
    r.status::text AS status, r.wait_reason, r.priority, r.run_after, r.attempts, r.max_attempts,
    r.created_at, r.updated_at, r.started_at, r.finished_at, r.dead_lettered_at,
    r.idempotency_key, r.lease_worker_id, r.lease_generation, r.lease_expires_at,
    r.recovery_checkpoint_id, r.cancel_action, r.cancel_requested_at, r.checkpoint_seq,
    r.payload::text AS payload, r.output::text AS output, r.error::text AS error,
    r.metadata::text AS metadata, r.progress::text AS progress"""

# A run known by its id alone (the run page, a search, `zeroth-pg runs show` without its scope):
# one probe of runs_pkey, which leads with run_id (run_id, tenant_id, workspace_key; migration
# 0023), whatever the run's status and the number of scopes, on PostgreSQL 15 as on 18. No index
# of its own: one on run_id would take an entry at every enqueue and every completion (issue 30).
# Every scope's run of that id (a caller may reuse another scope's id): the caller picks. Read
# through zeroth.run_list, as the caller (a reader's row-level security adds its tenant, the
# key's second column, to the same probe).
def run_by_id(columns: str, run_id: str, where: str = "") -> str:
    """A query of ``columns`` (of zeroth.run_list, alias ``r``) for the run ``run_id`` (a
    parameter such as ``$1``) in every scope, with ``where`` (more predicates on ``r``, joined by
    AND): one probe of runs_pkey."""
    more = f" AND {where}" if where else ""
    return f"""SELECT {columns} FROM zeroth.run_list r
         WHERE r.run_id = {run_id}{more}"""


_LIST_WHERE = """($1::text IS NULL OR r.deployment_ref = $1)
       AND ($2::text[] IS NULL OR r.status::text = ANY ($2::text[]))
       AND ($3::text IS NULL OR r.tenant_id = $3)
       AND ($4::text IS NULL OR r.workspace_id = $4)"""

# Newest first: the runs that are not running (a backward walk of runs_created_not_running_idx)
# merged with the running ones (runs_running_idx: as many as there are live leases), each part
# with the LIMIT (sql/functions/views/run_list.sql).
LIST_RUNS = f"""SELECT r.* FROM (
        (SELECT {_RUN_COLUMNS}
           FROM zeroth.run_list r
          WHERE r.status <> 'running' AND {_LIST_WHERE}
          ORDER BY r.created_at DESC, r.run_id DESC LIMIT $5)
        UNION ALL
        (SELECT {_RUN_COLUMNS}
           FROM zeroth.run_list r
          WHERE r.status = 'running' AND {_LIST_WHERE}
          ORDER BY r.created_at DESC, r.run_id DESC LIMIT $5)) r
     ORDER BY r.created_at DESC, r.run_id DESC
     LIMIT $5"""

FIND_RUN = run_by_id(f"{_RUN_COLUMNS}, r.workspace_key", "$1",
                     "($2::text IS NULL OR r.tenant_id = $2) "
                     "AND ($3::text IS NULL OR r.workspace_id = $3)")

RUN_CHECKPOINTS = """SELECT c.checkpoint_order, c.checkpoint_id, c.lease_generation, c.created_at,
           c.data::text AS data
      FROM zeroth.checkpoints c
     WHERE c.tenant_id = $1 AND c.workspace_key = $2 AND c.run_id = $3
     ORDER BY c.checkpoint_order"""

# The attempt history of one run, oldest first, through the view zeroth.attempt_history (the
# ended attempts of zeroth.run_attempts, written by the trigger runs_attempt_history, and the open
# one from zeroth.runs). Filtered on (tenant_id, workspace_key, run_id), each part is a range of
# its table's index (run_attempts_run_idx, runs_pkey).
RUN_ATTEMPTS = """SELECT a.attempt, a.lease_generation, a.worker_id, a.claimed_at, a.started_at,
           a.ended_at, a.outcome, a.error::text AS error
      FROM zeroth.attempt_history a
     WHERE a.tenant_id = $1 AND a.workspace_key = $2 AND a.run_id = $3
     ORDER BY a.lease_generation, a.claimed_at NULLS FIRST, a.ended_at NULLS LAST"""

# One row per (tenant, workspace, deployment) of zeroth.scope_overview (the dashboard's overview:
# one home for the counts), with its zeroth.scope_limits row's limits (NULL without one;
# rate_limit as key:max_starts/periods). Read as the caller: a zeroth_reader sees its own tenant.
_STATUS_SCOPES = """SELECT o.tenant_id, o.workspace_id, o.deployment_ref, o.pending, o.due,
           o.scheduled, o.running, o.live_leases, o.expired_leases, o.waiting, o.failed,
           o.dead_letters, x.max_concurrency, x.weight, x.paused,
           CASE WHEN x.rate_limit IS NOT NULL
                THEN x.rate_limit || ':' || coalesce(rl.max_starts::text || '/'
                                                     || rl.period_seconds::text || 's', '?')
           END AS rate_limit
      FROM zeroth.scope_overview o
      LEFT JOIN zeroth.scope_limits x
             ON x.tenant_id = o.tenant_id
            AND x.workspace_key = CASE WHEN o.workspace_id IS NULL THEN ''
                                       ELSE 'w:' || o.workspace_id END
            AND x.deployment_ref = o.deployment_ref
      LEFT JOIN zeroth.rate_limits rl ON rl.name = x.rate_limit
     WHERE ($1::text IS NULL OR o.deployment_ref = $1)
       AND ($2::text IS NULL OR o.tenant_id = $2)
       AND ($3::text IS NULL OR o.workspace_id = $3)"""

STATUS = f"""{_STATUS_SCOPES}
     ORDER BY o.tenant_id, o.workspace_id NULLS FIRST, o.deployment_ref"""

# The rows of STATUS summed per deployment (every scope together): how many scopes it has and
# how many of them are paused.
STATUS_BY_DEPLOYMENT = f"""SELECT t.deployment_ref, count(*) AS scopes,
           sum(t.pending)::bigint AS pending, sum(t.due)::bigint AS due,
           sum(t.scheduled)::bigint AS scheduled, sum(t.running)::bigint AS running,
           sum(t.live_leases)::bigint AS live_leases,
           sum(t.expired_leases)::bigint AS expired_leases,
           sum(t.waiting)::bigint AS waiting, sum(t.failed)::bigint AS failed,
           sum(t.dead_letters)::bigint AS dead_letters,
           count(*) FILTER (WHERE t.paused) AS paused_scopes
      FROM ({_STATUS_SCOPES}) t
     GROUP BY t.deployment_ref
     ORDER BY t.deployment_ref"""

DATABASE_NOW = "SELECT clock_timestamp()"
DATABASE_NOW_PLUS = "SELECT clock_timestamp() + $1::interval"

SCHEDULE_COLUMNS = """schedule_id, tenant_id, workspace_id, name, deployment_ref, cron,
    interval_seconds, time_zone, anchor_at, payload::text AS payload, metadata::text AS metadata,
    priority, max_attempts, missed_fire_policy, catch_up_limit, misfire_grace_seconds, paused,
    managed_by, next_fire_at, last_fire_at, fire_count, skipped_count, created_at, updated_at,
    last_error, last_error_at"""

CREATE_SCHEDULE = f"""SELECT {SCHEDULE_COLUMNS} FROM zeroth.create_schedule(name => $1,
    deployment_ref => $2, cron => $3, interval_seconds => $4, tenant_id => $5, workspace_id => $6,
    time_zone => $7, payload => $8::text::jsonb, metadata => $9::text::jsonb, priority => $10,
    max_attempts => $11, missed_fire_policy => $12, catch_up_limit => $13,
    misfire_grace_seconds => $14, start_at => $15, paused => $16)"""

ALTER_SCHEDULE = f"""SELECT {SCHEDULE_COLUMNS} FROM zeroth.alter_schedule(name => $1,
    tenant_id => $2, workspace_id => $3, deployment_ref => $4, cron => $5, interval_seconds => $6,
    time_zone => $7, payload => $8::text::jsonb, metadata => $9::text::jsonb, priority => $10,
    max_attempts => $11, missed_fire_policy => $12, catch_up_limit => $13,
    misfire_grace_seconds => $14, start_at => $15)"""

PAUSE_SCHEDULE = f"""SELECT {SCHEDULE_COLUMNS} FROM zeroth.pause_schedule(name => $1,
    tenant_id => $2, workspace_id => $3)"""

RESUME_SCHEDULE = f"""SELECT {SCHEDULE_COLUMNS} FROM zeroth.resume_schedule(name => $1,
    tenant_id => $2, workspace_id => $3)"""

DELETE_SCHEDULE = """SELECT zeroth.delete_schedule(name => $1, tenant_id => $2,
    workspace_id => $3)"""

LIST_SCHEDULES = f"""SELECT {SCHEDULE_COLUMNS} FROM zeroth.list_schedules(tenant_id => $1,
    workspace_id => $2, deployment_refs => $3::text[])"""

REGISTER_SCHEDULE = """SELECT schedule_id, outcome, next_fire_at, paused
    FROM zeroth.register_schedule(name => $1, deployment_ref => $2, cron => $3,
    interval_seconds => $4, tenant_id => $5, workspace_id => $6, time_zone => $7,
    payload => $8::text::jsonb, metadata => $9::text::jsonb, priority => $10, max_attempts => $11,
    missed_fire_policy => $12, catch_up_limit => $13, misfire_grace_seconds => $14)"""

FIRE_SCHEDULE_NOW = """SELECT schedule_id, tenant_id, workspace_id, name, deployment_ref,
    fire_at, run_id, created, skipped, next_due_at
    FROM zeroth.fire_schedule_now(name => $1, tenant_id => $2, workspace_id => $3,
                                  idempotency_key => $4)"""

FIRE_DUE_SCHEDULES = """SELECT schedule_id, tenant_id, workspace_id, name, deployment_ref,
    fire_at, run_id, created, skipped, next_due_at
    FROM zeroth.fire_due_schedules(deployment_refs => $1::text[], tenant_ids => $2::text[],
    workspace_ids => $3::text[], max_schedules => $4, max_fires => $5)"""

# -- operator reads of `zeroth-pg deployments show` ----------------------------------------------

# The change log of one deployment's defaults, newest first (zeroth.deployment_changes: readable
# by zeroth_reader and the owner).
DEPLOYMENT_CHANGES = """SELECT version, changed_at, changed_by, acting_role, via,
    old_values::text AS old_values, new_values::text AS new_values
    FROM zeroth.deployment_changes WHERE deployment_ref = $1 ORDER BY version DESC LIMIT $2"""

# The per-scope limits of one deployment (zeroth.scope_limits, their one home: concurrency, pause,
# weight, rate limit). Read as the caller: a zeroth_reader sees its own tenant's scopes.
DEPLOYMENT_SCOPE_LIMITS = """SELECT l.tenant_id, l.workspace_id, l.max_concurrency, l.weight,
    l.paused, l.rate_limit, l.note
    FROM zeroth.scope_limits l WHERE l.deployment_ref = $1
    ORDER BY l.tenant_id, l.workspace_key"""
