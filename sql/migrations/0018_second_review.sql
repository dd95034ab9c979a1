-- 0018_second_review: state changes for the second outside review's findings (issue 29).
--
-- Each section below names the finding it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Waiting runs and failed runs that are not dead letters, counted by zeroth.scope_overview (and
-- so by the dashboard and `zeroth-pg status`) through their own partial indexes (issue 31, item
-- 3: an operator missed every stuck approval and 3 of 5 failed runs). A run enters each index
-- only while it is waiting or failed, so the claim and completion path writes neither. The
-- deployment leads, so that no statement that finds one run of a scope (resume_run's UPDATE by
-- tenant, workspace key, run_id and status 'waiting') can take either index for a range of the
-- scope: with (tenant_id, workspace_key) first a generic plan walked every waiting run of the
-- scope instead of probing the primary key (tests/plans/test_generic_plans_all.py).
CREATE INDEX runs_waiting_idx ON zeroth.runs (deployment_ref, tenant_id, workspace_id)
    WHERE status = 'waiting';
CREATE INDEX runs_failed_idx ON zeroth.runs (deployment_ref, tenant_id, workspace_id)
    WHERE status = 'failed' AND dead_lettered_at IS NULL;

-- The dashboard's run page links a parent run to its children (issue 31, item 4): zeroth_reader
-- reads zeroth.child_runs (through the view zeroth.child_list), its own tenant's rows only, as
-- it reads run_steps and event_waits (0015).
GRANT SELECT ON zeroth.child_runs TO zeroth_reader;
CREATE POLICY child_runs_reader_tenant ON zeroth.child_runs FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY child_runs_reader_tenant ON zeroth.child_runs IS 'zeroth_reader sees the child runs of the tenant named in the setting zeroth.tenant_id (none when unset).';

-- Finding 5 (a worker pre-empted a DBA's schedule): zeroth.runs.schedule_id names the schedule
-- whose fire made the run. Only fire_due_schedules sets it (through zeroth._enqueue_run; no
-- public function takes it and commit_fenced cannot write it), and fire_due_schedules accepts an
-- existing run under a fire's idempotency key only when that run carries its schedule_id, so a
-- run planted under a 'zeroth-schedule:' key before this upgrade (the public functions refuse
-- that prefix now, ZP011) pauses the schedule instead of passing for its fire. Runs made before
-- this upgrade keep NULL: which of them a firer made cannot be told now (their metadata was
-- writable by anyone who could enqueue). A nullable column without a default: no rewrite.
ALTER TABLE zeroth.runs ADD COLUMN schedule_id uuid;
COMMENT ON COLUMN zeroth.runs.schedule_id IS 'The schedule whose fire made this run (fire_due_schedules, the only writer); NULL for every other run and for runs fired before 0018. fire_due_schedules takes an existing run under a fire''s idempotency key as that fire only when it carries the schedule''s id.';

-- Finding 8 (zeroth.events was never pruned): prune_runs deletes the event rows older than its
-- cutoff (emitted_at, or created_at for a channel nobody emitted) that no run waits on. This
-- index finds them oldest first without reading the table; emit_event changes emitted_at once
-- per event, and wait_for_event's no-op update of created_at stays a HOT update (same value).
CREATE INDEX events_age_idx ON zeroth.events ((coalesce(emitted_at, created_at)));
COMMENT ON TABLE zeroth.events IS 'External events of a scope by name (emit_event): payload and emitted_at are written once (first write wins). A row with emitted_at NULL is a channel a run waits on; its row lock serialises wait_for_event against emit_event. prune_runs deletes a row once it is older than its cutoff (emitted_at, or created_at of a channel) and no run waits on the name; an emit after that is a new event.';

-- Finding 11 (a rate-limit key shared by two tenants showed each tenant's reader the other's
-- last_start_at): readers keep SELECT on the key's settings (the keys their tenant's scopes name,
-- by the policy rate_limits_reader_tenant) but not on last_start_at, the time of the last claim
-- under the key, which may be another tenant's.
REVOKE SELECT ON zeroth.rate_limits FROM zeroth_reader;
GRANT SELECT (name, max_starts, period_seconds, note) ON zeroth.rate_limits TO zeroth_reader;

-- Finding 3 (admit-and-own runs ignored the DBA's pause, concurrency limit and rate limit):
-- admit_run's lease now obeys the scope's zeroth.scope_limits row, and an admission without room
-- is admitted unleased; retry_after_s also says when the rate key has a start again.
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own, when the scope''s zeroth.scope_limits row left room for the lease: not paused, a free slot, a start of its rate key; otherwise the run is admitted unleased, pending for the ordinary claims); active_run_id and retry_after_s name the run the thread waits for (busy, queued); an admission admitted unleased because its rate key had no start left carries retry_after_s = the seconds until it has one. displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';

-- A scope's names as long as the functions accept them (red-team pass on issue 29): a DBA's INSERT
-- of a run whose tenant_id, workspace_id or deployment_ref is longer than 200 characters, which
-- no function accepts, made every fleet claim and sweep with a max_concurrency raise ZP008 on that
-- scope's slot rows. NOT VALID: rows already there are not read (no scan, no failed upgrade);
-- every new or updated row is checked.
ALTER TABLE zeroth.runs ADD CONSTRAINT runs_scope_names_bounded
    CHECK (length(tenant_id) <= 200 AND length(deployment_ref) <= 200
           AND (workspace_id IS NULL OR length(workspace_id) <= 200)) NOT VALID;
