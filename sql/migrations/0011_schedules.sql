-- 0011_schedules: periodic runs, with the time kept in the database (issue 15).
--
--   * zeroth.schedules: one row per schedule of a scope (tenant, workspace; unique by name): the
--     deployment and the payload its runs get, a 5-field cron expression on the wall clock of an
--     IANA time zone or a fixed interval of seconds from an anchor, a missed-fire policy, and
--     next_fire_at, the next fire time, kept by the functions (sql/functions/schedules/). Written
--     by the functions only; zeroth_reader sees its tenant's rows (like zeroth.runs).
--   * zeroth.schedule_fires: the exactly-once record, one row per (schedule, fire time) that
--     became a run. Its primary key makes a second run for one fire time impossible, whoever
--     fires, however often and whatever the clock did; fire_due_schedules prunes rows older than
--     7 days; schedules.last_fire_at (the high-water mark, never pruned) still guards them.
--   * zeroth.schedule_fire: a row of fire_due_schedules.

CREATE TABLE zeroth.schedules (
    schedule_id           uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id             text        NOT NULL,
    workspace_id          text,
    workspace_key         text        GENERATED ALWAYS AS (
                                          CASE WHEN workspace_id IS NULL THEN '' ELSE 'w:' || workspace_id END
                                      ) STORED NOT NULL,
    name                  text        NOT NULL,
    deployment_ref        text        NOT NULL,
    cron                  text,
    interval_seconds      integer,
    time_zone             text        NOT NULL DEFAULT 'UTC',
    anchor_at             timestamptz NOT NULL,
    payload               jsonb       NOT NULL DEFAULT '{}'::jsonb,
    metadata              jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority              integer     NOT NULL DEFAULT 0,
    max_attempts          integer     NOT NULL DEFAULT 3,
    missed_fire_policy    text        NOT NULL DEFAULT 'skip',
    catch_up_limit        integer,
    misfire_grace_seconds integer     NOT NULL DEFAULT 60,
    paused                boolean     NOT NULL DEFAULT false,
    managed_by            text        NOT NULL DEFAULT 'sql',
    next_fire_at          timestamptz,
    last_fire_at          timestamptz,
    fire_count            bigint      NOT NULL DEFAULT 0,
    skipped_count         bigint      NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    last_error            text,
    last_error_at         timestamptz,
    CONSTRAINT schedules_pkey PRIMARY KEY (schedule_id),
    CONSTRAINT schedules_name_key UNIQUE (tenant_id, workspace_key, name),
    CONSTRAINT schedules_tenant_nonempty CHECK (tenant_id <> ''),
    -- enqueue_run's identifier limits (zeroth._require_identifier): a row its runs cannot carry
    -- would fail every fire.
    CONSTRAINT schedules_tenant_valid CHECK (length(tenant_id) <= 200),
    CONSTRAINT schedules_workspace_valid CHECK (workspace_id IS NULL OR (workspace_id <> '' AND length(workspace_id) <= 200)),
    CONSTRAINT schedules_time_zone_valid CHECK (time_zone <> '' AND length(time_zone) <= 100),
    CONSTRAINT schedules_cron_valid CHECK (cron IS NULL OR (btrim(cron) <> '' AND length(cron) <= 500)),
    -- No instant is infinite: the fire-time walks (_cron_next) need a finite start.
    CONSTRAINT schedules_times_finite CHECK (
        isfinite(anchor_at) AND isfinite(created_at) AND isfinite(updated_at)
        AND (next_fire_at IS NULL OR isfinite(next_fire_at))
        AND (last_fire_at IS NULL OR isfinite(last_fire_at))
        AND (last_error_at IS NULL OR isfinite(last_error_at))),
    CONSTRAINT schedules_name_valid CHECK (name <> '' AND length(name) <= 200),
    CONSTRAINT schedules_deployment_valid CHECK (deployment_ref <> '' AND length(deployment_ref) <= 200),
    CONSTRAINT schedules_one_timing CHECK ((cron IS NULL) <> (interval_seconds IS NULL)),
    CONSTRAINT schedules_interval_valid CHECK (interval_seconds BETWEEN 1 AND 31622400),
    CONSTRAINT schedules_policy_valid CHECK (
        (missed_fire_policy = 'skip' AND catch_up_limit IS NULL)
        OR (missed_fire_policy = 'catch_up' AND catch_up_limit BETWEEN 1 AND 1000)),
    CONSTRAINT schedules_grace_valid CHECK (misfire_grace_seconds BETWEEN 1 AND 86400),
    CONSTRAINT schedules_max_attempts_valid CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT schedules_payload_object CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT schedules_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    CONSTRAINT schedules_managed_by_valid CHECK (managed_by IN ('sql', 'app'))
);
COMMENT ON TABLE zeroth.schedules IS 'Periodic runs: one row per schedule of a scope (unique name per tenant and workspace). Each fire time becomes one run of deployment_ref (payload, metadata, priority, max_attempts), enqueued by zeroth.fire_due_schedules exactly once (zeroth.schedule_fires). Written by the schedule functions only; zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.schedules.cron IS 'A standard 5-field cron expression (minute hour day-of-month month day-of-week) evaluated on the wall clock of time_zone; NULL for an interval schedule.';
COMMENT ON COLUMN zeroth.schedules.interval_seconds IS 'Fire every interval_seconds seconds from anchor_at (time_zone plays no part); NULL for a cron schedule.';
COMMENT ON COLUMN zeroth.schedules.time_zone IS 'The IANA time zone the cron expression is read in (canonical name from pg_timezone_names).';
COMMENT ON COLUMN zeroth.schedules.anchor_at IS 'Interval schedules fire at anchor_at + k * interval_seconds; the creation time unless given.';
COMMENT ON COLUMN zeroth.schedules.missed_fire_policy IS 'What fires when several fire times are due at once (no firer was running, a pause of the worker fleet, a clock step forward): skip = only the most recent one, and only when it is late by at most misfire_grace_seconds; catch_up = the catch_up_limit most recent ones, oldest first. The others are counted in skipped_count.';
COMMENT ON COLUMN zeroth.schedules.managed_by IS 'sql: created or last changed by a DBA (create_schedule, alter_schedule): register_schedule (a worker''s start) never changes it. app: registered by an application; its next registration may update the definition (never paused).';
COMMENT ON COLUMN zeroth.schedules.last_fire_at IS 'The newest fire time that became a run: the high-water mark, never moved back and never pruned. fire_due_schedules never fires a time at or before it, whatever next_fire_at says (exactly once even after schedule_fires and the runs were pruned).';
COMMENT ON COLUMN zeroth.schedules.last_error IS 'Why the last fire of this schedule failed (SQLSTATE: message), NULL if none since the last resume or change. A schedule whose fire raised is paused by fire_due_schedules, so one bad row never stops the others; fix it and resume_schedule.';
COMMENT ON COLUMN zeroth.schedules.last_error_at IS 'When last_error happened (database time).';
COMMENT ON COLUMN zeroth.schedules.next_fire_at IS 'The next fire time not yet fired (NULL: never fires again). A fire time is due when next_fire_at <= the database clock.';
ALTER TABLE zeroth.schedules OWNER TO zeroth_owner;
ALTER TABLE zeroth.schedules ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.schedules FROM PUBLIC;
GRANT SELECT ON zeroth.schedules TO zeroth_reader;
CREATE POLICY schedules_reader_tenant ON zeroth.schedules FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY schedules_reader_tenant ON zeroth.schedules IS 'zeroth_reader sees the schedules of the tenant named in the setting zeroth.tenant_id (none when unset).';
-- What fire_due_schedules scans: the due, unpaused schedules of the deployments a firer serves.
CREATE INDEX schedules_due_idx ON zeroth.schedules (deployment_ref, next_fire_at)
    WHERE NOT paused AND next_fire_at IS NOT NULL;

CREATE TABLE zeroth.schedule_fires (
    schedule_id uuid        NOT NULL REFERENCES zeroth.schedules (schedule_id) ON DELETE CASCADE,
    fire_at     timestamptz NOT NULL,
    tenant_id   text        NOT NULL,
    run_id      uuid        NOT NULL,
    fired_at    timestamptz NOT NULL,
    CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule_id, fire_at),
    CONSTRAINT schedule_fires_finite CHECK (isfinite(fire_at) AND isfinite(fired_at))
);
COMMENT ON TABLE zeroth.schedule_fires IS 'The exactly-once record of schedules: one row per (schedule, fire time) that became a run (run_id; fired_at = database time of the firing). Rows older than 7 days are pruned by fire_due_schedules. zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';
ALTER TABLE zeroth.schedule_fires OWNER TO zeroth_owner;
ALTER TABLE zeroth.schedule_fires ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.schedule_fires FROM PUBLIC;
GRANT SELECT ON zeroth.schedule_fires TO zeroth_reader;
CREATE POLICY schedule_fires_reader_tenant ON zeroth.schedule_fires FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY schedule_fires_reader_tenant ON zeroth.schedule_fires IS 'zeroth_reader sees the fires of the tenant named in the setting zeroth.tenant_id (none when unset).';

CREATE TYPE zeroth.schedule_fire AS (
    schedule_id    uuid,
    tenant_id      text,
    workspace_id   text,
    name           text,
    deployment_ref text,
    fire_at        timestamptz,
    run_id         uuid,
    created        boolean,
    skipped        bigint,
    next_due_at    timestamptz
);
COMMENT ON TYPE zeroth.schedule_fire IS 'A row of fire_due_schedules: one fire time that became a run (created false: the run already existed under its idempotency key), with the fire times of that schedule skipped by its missed-fire policy in this call; or one row with schedule_id NULL when nothing fired. next_due_at (every row): the earliest next_fire_at of the schedules served after this call, NULL when none will fire.';
ALTER TYPE zeroth.schedule_fire OWNER TO zeroth_owner;
