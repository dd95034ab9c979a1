-- sql/schema.sql: the state of schema zeroth as the migrations leave it (types, tables,
-- indexes, constraints, policies, owners, privileges, comments). The functions, views and
-- the trigger are not here: each has its own file in sql/functions/.
-- Generated; do not edit. Regenerate with `python -m zeroth_pg.migrate dump-schema`;
-- tests/migrations/test_schema_drift.py fails when it drifts.

--
-- Name: zeroth; Type: SCHEMA; Schema: -; Owner: zeroth_owner
--
CREATE SCHEMA zeroth;

ALTER SCHEMA zeroth OWNER TO zeroth_owner;

--
-- Name: SCHEMA zeroth; Type: COMMENT; Schema: -; Owner: zeroth_owner
--
COMMENT ON SCHEMA zeroth IS 'zeroth_pg: a Postgres-native durable run dispatcher. The public API is the functions in this schema.';

--
-- Name: run_status; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.run_status AS ENUM (
    'pending',
    'running',
    'waiting',
    'completed',
    'failed',
    'cancelled'
);

ALTER TYPE zeroth.run_status OWNER TO zeroth_owner;

--
-- Name: TYPE run_status; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.run_status IS 'Status axis of a run. The lease axis (lease_* columns) is orthogonal: see docs/state-machine.md.';

--
-- Name: admission; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.admission AS (
	outcome text,
	run_id uuid,
	status zeroth.run_status,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	active_run_id uuid,
	retry_after_s integer,
	displaced jsonb
);

ALTER TYPE zeroth.admission OWNER TO zeroth_owner;

--
-- Name: TYPE admission; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.admission IS 'Result of admit_run. outcome: admitted | queued | busy | reused. lease_* are set when the caller holds the run (admit-and-own, when the scope''s zeroth.scope_limits row left room for the lease: not paused, a free slot, a start of its rate key; otherwise the run is admitted unleased, pending for the ordinary claims); active_run_id and retry_after_s name the run the thread waits for (busy, queued); an admission admitted unleased because its rate key had no start left carries retry_after_s = the seconds until it has one. displaced lists the runs an interrupt/rollback cancelled or asked to stop: [{run_id, outcome, worker_id, lease_generation}].';

--
-- Name: cancel_result; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.cancel_result AS (
	outcome text,
	run_id uuid,
	status zeroth.run_status,
	cancel_action text,
	lease_worker_id text,
	lease_generation bigint,
	retry_after_s integer
);

ALTER TYPE zeroth.cancel_result OWNER TO zeroth_owner;

--
-- Name: TYPE cancel_result; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.cancel_result IS 'Result of request_cancel_v2. outcome: cancelled | cancel_requested | taken_over | not_cancellable | unknown; status after the call; the winning cancel_action; the owner asked to stop or displaced; retry_after_s = seconds until the owner''s lease + grace runs out (a cancel retried then takes over).';

--
-- Name: claimed_run; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.claimed_run AS (
	run_id uuid,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	status zeroth.run_status,
	attempts integer,
	max_attempts integer,
	priority integer,
	thread_id text,
	idempotency_key text,
	payload jsonb,
	metadata jsonb,
	recovery_checkpoint_id uuid,
	checkpoint_data jsonb,
	cancel_requested boolean,
	active_count integer,
	concurrency_saturated boolean,
	concurrency_limit integer,
	retry_at timestamp with time zone,
	retry_after double precision,
	deadline_at timestamp with time zone,
	deadline_in double precision
);

ALTER TYPE zeroth.claimed_run OWNER TO zeroth_owner;

--
-- Name: TYPE claimed_run; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.claimed_run IS 'A row of a claim: a leased run, or with run_id NULL what the claim saw instead (active_count, concurrency_saturated, concurrency_limit). retry_at / retry_after (seconds from the claim''s database time): the scope''s rate limit held the claim back (run_id NULL) or cut its batch short (claimed rows); no start is possible before then.';

--
-- Name: deployment_registration; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.deployment_registration AS (
	outcome text,
	deployment_ref text,
	max_attempts integer,
	priority integer,
	managed_by text,
	version bigint,
	previous jsonb,
	retry_base_seconds double precision,
	retry_max_seconds double precision,
	lease_seconds double precision,
	attempt_timeout_seconds double precision,
	run_timeout_seconds double precision
);

ALTER TYPE zeroth.deployment_registration OWNER TO zeroth_owner;

--
-- Name: TYPE deployment_registration; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.deployment_registration IS 'The result of register_deployment / set_deployment_defaults: outcome (created, updated, unchanged, kept) and the deployment''s defaults as they now are (retry_base_seconds, retry_max_seconds, lease_seconds, attempt_timeout_seconds, run_timeout_seconds NULL: not set); previous: the values an update replaced, else NULL.';

--
-- Name: enqueue_item; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.enqueue_item AS (
	"position" bigint,
	payload jsonb,
	priority integer,
	run_after timestamp with time zone,
	max_attempts integer,
	idempotency_key text,
	metadata jsonb,
	run_id uuid,
	thread_id text,
	new_run_id uuid,
	attempt_timeout_seconds integer,
	run_timeout_seconds integer
);

ALTER TYPE zeroth.enqueue_item OWNER TO zeroth_owner;

--
-- Name: TYPE enqueue_item; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.enqueue_item IS 'Internal: one parsed item of an enqueue_runs batch; new_run_id is the caller''s run_id or a fresh one.';

--
-- Name: enqueued_run; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.enqueued_run AS (
	run_id uuid,
	created boolean,
	status zeroth.run_status
);

ALTER TYPE zeroth.enqueued_run OWNER TO zeroth_owner;

--
-- Name: TYPE enqueued_run; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.enqueued_run IS 'Result of enqueue_run(s): created is false when an idempotency key or caller-chosen run_id matched an existing run, which is returned instead.';

--
-- Name: lease_renewal; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.lease_renewal AS (
	run_id uuid,
	renewed boolean,
	lease_expires_at timestamp with time zone,
	cancel_requested boolean,
	sqlstate text
);

ALTER TYPE zeroth.lease_renewal OWNER TO zeroth_owner;

--
-- Name: TYPE lease_renewal; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.lease_renewal IS 'Result row of renew_leases: one per requested (run_id, generation); sqlstate ZP013 when the lease was not renewed because the attempt''s or the run''s deadline passed (since 0021), else NULL.';

--
-- Name: schedule_fire; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.schedule_fire AS (
	schedule_id uuid,
	tenant_id text,
	workspace_id text,
	name text,
	deployment_ref text,
	fire_at timestamp with time zone,
	run_id uuid,
	created boolean,
	skipped bigint,
	next_due_at timestamp with time zone
);

ALTER TYPE zeroth.schedule_fire OWNER TO zeroth_owner;

--
-- Name: TYPE schedule_fire; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.schedule_fire IS 'A row of fire_due_schedules: one fire time that became a run (created false: the run already existed under its idempotency key), with the fire times of that schedule skipped by its missed-fire policy in this call; or one row with schedule_id NULL when nothing fired. next_due_at (every row): the earliest next_fire_at of the schedules served after this call, NULL when none will fire.';

--
-- Name: scope_claimed_run; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.scope_claimed_run AS (
	tenant_id text,
	workspace_id text,
	deployment_ref text,
	run_id uuid,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	status zeroth.run_status,
	attempts integer,
	max_attempts integer,
	priority integer,
	thread_id text,
	idempotency_key text,
	payload jsonb,
	metadata jsonb,
	recovery_checkpoint_id uuid,
	checkpoint_data jsonb,
	cancel_requested boolean,
	active_count integer,
	concurrency_saturated boolean,
	concurrency_limit integer,
	retry_at timestamp with time zone,
	retry_after double precision,
	deadline_at timestamp with time zone,
	deadline_in double precision
);

ALTER TYPE zeroth.scope_claimed_run OWNER TO zeroth_owner;

--
-- Name: TYPE scope_claimed_run; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.scope_claimed_run IS 'A row of claim_and_start_scopes: a claimed run with its scope (tenant, workspace, deployment), or a row with run_id NULL per scope that had claimable work but no free slot (saturated, or paused: concurrency_limit 0) or was held back by its rate limit (retry_at: the earliest time a start becomes possible).';

--
-- Name: takeover; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.takeover AS (
	run_id uuid,
	thread_id text,
	outcome text,
	status zeroth.run_status,
	previous_worker_id text,
	previous_generation bigint
);

ALTER TYPE zeroth.takeover OWNER TO zeroth_owner;

--
-- Name: TYPE takeover; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.takeover IS 'A run ended or handed back by claim_for_takeover / reconcile_thread_runs / claim_orphaned. outcome: failed (not resumable) | cancelled (a cancel was requested) | requeued (resumable: back to pending for another worker, the interrupted attempt still counted) | dead_lettered (resumable but out of attempts).';

--
-- Name: thread_run; Type: TYPE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TYPE zeroth.thread_run AS (
	run_id uuid,
	thread_id text,
	deployment_ref text,
	status zeroth.run_status,
	queued boolean,
	wait_reason text,
	attempts integer,
	max_attempts integer,
	resumable boolean,
	created_at timestamp with time zone,
	started_at timestamp with time zone,
	finished_at timestamp with time zone,
	updated_at timestamp with time zone,
	lease_worker_id text,
	lease_generation bigint,
	lease_expires_at timestamp with time zone,
	cancel_action text,
	cancel_requested_at timestamp with time zone,
	idempotency_key text,
	payload jsonb,
	metadata jsonb,
	output jsonb,
	error jsonb,
	progress jsonb,
	accounting jsonb
);

ALTER TYPE zeroth.thread_run OWNER TO zeroth_owner;

--
-- Name: TYPE thread_run; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TYPE zeroth.thread_run IS 'A run as list_thread_runs / get_thread_run report it; queued = waiting behind the active run of its thread.';

--
-- Name: deployments; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.deployments (
    deployment_ref text NOT NULL,
    max_attempts integer NOT NULL,
    priority integer NOT NULL,
    managed_by text NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    updated_by text NOT NULL,
    registered_by text,
    retry_base_seconds double precision,
    retry_max_seconds double precision,
    lease_seconds double precision,
    attempt_timeout_seconds double precision,
    run_timeout_seconds double precision,
    version_policy text DEFAULT 'any'::text NOT NULL,
    compatible_versions text[],
    max_run_events integer,
    CONSTRAINT deployments_lease_valid CHECK (((lease_seconds IS NULL) OR ((lease_seconds >= (1)::double precision) AND (lease_seconds <= (86400)::double precision)))),
    CONSTRAINT deployments_managed_by_valid CHECK ((managed_by = ANY (ARRAY['app'::text, 'sql'::text]))),
    CONSTRAINT deployments_max_attempts_valid CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT deployments_max_run_events_valid CHECK (((max_run_events IS NULL) OR ((max_run_events >= 100) AND (max_run_events <= 10000000)))),
    CONSTRAINT deployments_ref_valid CHECK (((deployment_ref <> ''::text) AND (length(deployment_ref) <= 200))),
    CONSTRAINT deployments_retry_valid CHECK ((((retry_base_seconds IS NULL) OR (retry_base_seconds >= (0)::double precision)) AND ((retry_max_seconds IS NULL) OR (retry_max_seconds <= ((86400 * 30))::double precision)) AND (COALESCE(retry_base_seconds, (1)::double precision) <= COALESCE(retry_max_seconds, (300)::double precision)) AND (COALESCE(retry_base_seconds, (1)::double precision) <= ((86400 * 30))::double precision))),
    CONSTRAINT deployments_timeouts_valid CHECK ((((attempt_timeout_seconds IS NULL) OR ((attempt_timeout_seconds >= (1)::double precision) AND (attempt_timeout_seconds <= ((86400 * 30))::double precision))) AND ((run_timeout_seconds IS NULL) OR ((run_timeout_seconds >= (1)::double precision) AND (run_timeout_seconds <= ((86400 * 365))::double precision))))),
    CONSTRAINT deployments_version_policy_valid CHECK (((version_policy = ANY (ARRAY['any'::text, 'same'::text, 'compatible'::text])) AND ((compatible_versions IS NULL) = (version_policy <> 'compatible'::text)))),
    CONSTRAINT deployments_version_positive CHECK ((version >= 1))
);

ALTER TABLE zeroth.deployments OWNER TO zeroth_owner;

--
-- Name: TABLE deployments; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.deployments IS 'The registry of deployments: the defaults every client''s enqueue_run / enqueue_runs (and child runs that pass none; a schedule stores its own values) give a run of the deployment when the caller passes NULL; an explicit value wins, and a run keeps the values it was enqueued with. Global (a deployment is code, the same in every scope); per-scope limits live in zeroth.scope_limits. Written only through zeroth.register_deployment (an application, managed_by app) and zeroth.set_deployment_defaults (a DBA, managed_by sql); every change is in zeroth.deployment_changes. zeroth_reader reads every row.';

--
-- Name: COLUMN deployments.max_attempts; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.max_attempts IS 'Attempts of a run enqueued without max_attempts (1-1000).';

--
-- Name: COLUMN deployments.priority; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.priority IS 'Priority of a run enqueued without priority (higher is claimed first).';

--
-- Name: COLUMN deployments.managed_by; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.managed_by IS 'app: the last application registration (zeroth.register_deployment) decides; sql: a DBA set it (zeroth.set_deployment_defaults) and registrations keep it.';

--
-- Name: COLUMN deployments.version; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.version IS '1 when created, + 1 with every change (the version of zeroth.deployment_changes that made the row as it is).';

--
-- Name: COLUMN deployments.updated_by; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.updated_by IS 'session_user of the last change (the SET ROLE in force, if any, is in zeroth.deployment_changes).';

--
-- Name: COLUMN deployments.registered_by; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.registered_by IS 'The login (session_user) whose application registered the row (managed_by app): only that login''s registrations change it, another''s are kept (one trust domain''s worker role cannot set the defaults of another''s runs). NULL: a DBA set the row or handed it back (set_deployment_defaults), and the next registration takes it.';

--
-- Name: COLUMN deployments.retry_base_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.retry_base_seconds IS 'Backoff base of a retry (zeroth.fail_run with retry_base_seconds NULL): about base * 2^(attempt - 1) with jitter. NULL: not set (1). Read at each failure: a change applies to the next failure.';

--
-- Name: COLUMN deployments.retry_max_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.retry_max_seconds IS 'Backoff cap of a retry (zeroth.fail_run with retry_max_seconds NULL). NULL: not set (300). Read at each failure: a change applies to the next failure.';

--
-- Name: COLUMN deployments.lease_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.lease_seconds IS 'Lease of a claim that names none (claim_pending, claim_and_start, complete_and_claim, claim_and_start_scopes, claim_orphaned, claim_orphaned_scopes, admit_run with lease_seconds NULL), 1 <= s <= 86400 (a shorter one would lapse before its run could start). NULL: not set (60). Read at each claim.';

--
-- Name: COLUMN deployments.attempt_timeout_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.attempt_timeout_seconds IS 'Bound on an attempt''s wall time (1 <= s <= 30 days) for the runs of the deployment that carry none: the claim sets runs.attempt_deadline_at = claim time + s and caps the lease there; past it the attempt is ended as timed out (retried or dead-lettered by the retry policy). NULL: not set (no bound). Read at each claim, in the probe that reads lease_seconds; binds as the lease does (zeroth._policy_binds_caller).';

--
-- Name: COLUMN deployments.run_timeout_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.run_timeout_seconds IS 'Bound on a run''s total time (1 <= s <= 365 days) from its first claim, for the runs of the deployment that carry none: the first claim sets runs.run_deadline_at; past it the run is failed for good (stop_reason run_timeout) and a pending one is never started. NULL: not set (no bound). Read at each claim; binds as the lease does.';

--
-- Name: COLUMN deployments.version_policy; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.version_policy IS 'Which code versions may resume a started run of the deployment (a run never started is claimable by every version): any (the default: every version), same (only the version that started it: runs.code_version_id), compatible (the same version, or any two versions both in compatible_versions). A run with no recorded version is resumed by every version. Set only by zeroth.set_version_policy (a DBA), so it binds every session.';

--
-- Name: COLUMN deployments.compatible_versions; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.compatible_versions IS 'version_policy compatible: the set of code versions that may resume each other''s runs; NULL under any other policy.';

--
-- Name: COLUMN deployments.max_run_events; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployments.max_run_events IS 'Bound on the events one run of the deployment may append to its stream (append_run_event; END is not counted): 100 to 10,000,000; NULL: the default, 10,000. Past it append_run_event raises ZP014 and stores nothing. Set by a DBA (UPDATE zeroth.deployments): no function or worker writes it; read at each append past the 100th event of a run.';

--
-- Name: schedules; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.schedules (
    schedule_id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id text NOT NULL,
    workspace_id text,
    workspace_key text GENERATED ALWAYS AS (
CASE
    WHEN (workspace_id IS NULL) THEN ''::text
    ELSE ('w:'::text || workspace_id)
END) STORED NOT NULL,
    name text NOT NULL,
    deployment_ref text NOT NULL,
    cron text,
    interval_seconds integer,
    time_zone text DEFAULT 'UTC'::text NOT NULL,
    anchor_at timestamp with time zone NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 3 NOT NULL,
    missed_fire_policy text DEFAULT 'skip'::text NOT NULL,
    catch_up_limit integer,
    misfire_grace_seconds integer DEFAULT 60 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    managed_by text DEFAULT 'sql'::text NOT NULL,
    next_fire_at timestamp with time zone,
    last_fire_at timestamp with time zone,
    fire_count bigint DEFAULT 0 NOT NULL,
    skipped_count bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    last_error text,
    last_error_at timestamp with time zone,
    CONSTRAINT schedules_cron_valid CHECK (((cron IS NULL) OR ((btrim(cron) <> ''::text) AND (length(cron) <= 500)))),
    CONSTRAINT schedules_deployment_valid CHECK (((deployment_ref <> ''::text) AND (length(deployment_ref) <= 200))),
    CONSTRAINT schedules_grace_valid CHECK (((misfire_grace_seconds >= 1) AND (misfire_grace_seconds <= 86400))),
    CONSTRAINT schedules_interval_valid CHECK (((interval_seconds >= 1) AND (interval_seconds <= 31622400))),
    CONSTRAINT schedules_managed_by_valid CHECK ((managed_by = ANY (ARRAY['sql'::text, 'app'::text]))),
    CONSTRAINT schedules_max_attempts_valid CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT schedules_metadata_object CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT schedules_name_valid CHECK (((name <> ''::text) AND (length(name) <= 200))),
    CONSTRAINT schedules_one_timing CHECK (((cron IS NULL) <> (interval_seconds IS NULL))),
    CONSTRAINT schedules_payload_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT schedules_policy_valid CHECK ((((missed_fire_policy = 'skip'::text) AND (catch_up_limit IS NULL)) OR ((missed_fire_policy = 'catch_up'::text) AND ((catch_up_limit >= 1) AND (catch_up_limit <= 1000))))),
    CONSTRAINT schedules_tenant_nonempty CHECK ((tenant_id <> ''::text)),
    CONSTRAINT schedules_tenant_valid CHECK ((length(tenant_id) <= 200)),
    CONSTRAINT schedules_time_zone_valid CHECK (((time_zone <> ''::text) AND (length(time_zone) <= 100))),
    CONSTRAINT schedules_times_finite CHECK ((isfinite(anchor_at) AND isfinite(created_at) AND isfinite(updated_at) AND ((next_fire_at IS NULL) OR isfinite(next_fire_at)) AND ((last_fire_at IS NULL) OR isfinite(last_fire_at)) AND ((last_error_at IS NULL) OR isfinite(last_error_at)))),
    CONSTRAINT schedules_workspace_valid CHECK (((workspace_id IS NULL) OR ((workspace_id <> ''::text) AND (length(workspace_id) <= 200))))
);

ALTER TABLE zeroth.schedules OWNER TO zeroth_owner;

--
-- Name: TABLE schedules; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.schedules IS 'Periodic runs: one row per schedule of a scope (unique name per tenant and workspace). Each fire time becomes one run of deployment_ref (payload, metadata, priority, max_attempts), enqueued by zeroth.fire_due_schedules exactly once (zeroth.schedule_fires). Written by the schedule functions only; zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';

--
-- Name: COLUMN schedules.cron; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.cron IS 'A standard 5-field cron expression (minute hour day-of-month month day-of-week) evaluated on the wall clock of time_zone; NULL for an interval schedule.';

--
-- Name: COLUMN schedules.interval_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.interval_seconds IS 'Fire every interval_seconds seconds from anchor_at (time_zone plays no part); NULL for a cron schedule.';

--
-- Name: COLUMN schedules.time_zone; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.time_zone IS 'The IANA time zone the cron expression is read in (canonical name from pg_timezone_names).';

--
-- Name: COLUMN schedules.anchor_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.anchor_at IS 'Interval schedules fire at anchor_at + k * interval_seconds; the creation time unless given.';

--
-- Name: COLUMN schedules.missed_fire_policy; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.missed_fire_policy IS 'What fires when several fire times are due at once (no firer was running, a pause of the worker fleet, a clock step forward): skip = only the most recent one, and only when it is late by at most misfire_grace_seconds; catch_up = the catch_up_limit most recent ones, oldest first. The others are counted in skipped_count.';

--
-- Name: COLUMN schedules.managed_by; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.managed_by IS 'sql: created or last changed by a DBA (create_schedule, alter_schedule): register_schedule (a worker''s start) never changes it. app: registered by an application; its next registration may update the definition (never paused).';

--
-- Name: COLUMN schedules.next_fire_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.next_fire_at IS 'The next fire time not yet fired (NULL: never fires again). A fire time is due when next_fire_at <= the database clock.';

--
-- Name: COLUMN schedules.last_fire_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.last_fire_at IS 'The newest fire time that became a run: the high-water mark, never moved back and never pruned. fire_due_schedules never fires a time at or before it, whatever next_fire_at says (exactly once even after schedule_fires and the runs were pruned).';

--
-- Name: COLUMN schedules.last_error; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.last_error IS 'Why the last fire of this schedule failed (SQLSTATE: message), NULL if none since the last resume or change. A schedule whose fire raised is paused by fire_due_schedules, so one bad row never stops the others; fix it and resume_schedule.';

--
-- Name: COLUMN schedules.last_error_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.schedules.last_error_at IS 'When last_error happened (database time).';

--
-- Name: runs; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.runs (
    run_id uuid NOT NULL,
    tenant_id text NOT NULL,
    workspace_id text,
    workspace_key text GENERATED ALWAYS AS (
CASE
    WHEN (workspace_id IS NULL) THEN ''::text
    ELSE ('w:'::text || workspace_id)
END) STORED NOT NULL,
    deployment_ref text NOT NULL,
    thread_id text,
    status zeroth.run_status DEFAULT 'pending'::zeroth.run_status NOT NULL,
    wait_reason text,
    attempts integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    output jsonb,
    error jsonb,
    lease_worker_id text,
    lease_acquired_at timestamp with time zone,
    lease_expires_at timestamp with time zone,
    lease_generation bigint DEFAULT 0 NOT NULL,
    admission_slot integer,
    recovery_checkpoint_id uuid,
    cancel_action text,
    cancel_requested_at timestamp with time zone,
    dead_lettered_at timestamp with time zone,
    thread_queued_at timestamp with time zone,
    parent_run_id uuid,
    schedule_id uuid,
    attempt_recorded_generation bigint,
    attempt_timeout_seconds integer,
    run_timeout_seconds integer,
    attempt_deadline_at timestamp with time zone,
    run_deadline_at timestamp with time zone,
    code_version_id bigint,
    completed_worker_id text,
    completed_claimed_at timestamp with time zone,
    max_attempts integer DEFAULT 3 NOT NULL,
    checkpoint_seq bigint DEFAULT 0 NOT NULL,
    hand_backs integer DEFAULT 0 NOT NULL,
    resumable boolean DEFAULT true NOT NULL,
    progress jsonb,
    accounting jsonb,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL,
    run_after timestamp with time zone NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    idempotency_key text,
    CONSTRAINT runs_accounting_object CHECK (((accounting IS NULL) OR (jsonb_typeof(accounting) = 'object'::text))),
    CONSTRAINT runs_attempts_valid CHECK (((attempts >= 0) AND (max_attempts >= 1))),
    CONSTRAINT runs_cancel_action_valid CHECK (((cancel_action IS NULL) OR (cancel_action = ANY (ARRAY['cancel'::text, 'interrupt'::text, 'rollback'::text])))),
    CONSTRAINT runs_deployment_nonempty CHECK ((deployment_ref <> ''::text)),
    CONSTRAINT runs_generation_nonnegative CHECK ((lease_generation >= 0)),
    CONSTRAINT runs_hand_backs_nonnegative CHECK ((hand_backs >= 0)),
    CONSTRAINT runs_lease_complete CHECK ((((lease_worker_id IS NULL) = (lease_expires_at IS NULL)) AND ((lease_worker_id IS NULL) = (lease_acquired_at IS NULL)))),
    CONSTRAINT runs_lease_only_on_active CHECK (((lease_worker_id IS NULL) OR (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status])))),
    CONSTRAINT runs_metadata_object CHECK ((jsonb_typeof(metadata) = 'object'::text)),
    CONSTRAINT runs_payload_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT runs_running_has_lease CHECK (((status <> 'running'::zeroth.run_status) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_slot_needs_lease CHECK (((admission_slot IS NULL) OR (lease_worker_id IS NOT NULL))),
    CONSTRAINT runs_tenant_nonempty CHECK ((tenant_id <> ''::text)),
    CONSTRAINT runs_thread_queue_waits CHECK (((thread_queued_at IS NULL) OR ((status = 'waiting'::zeroth.run_status) AND (thread_id IS NOT NULL)))),
    CONSTRAINT runs_timeouts_valid CHECK ((((attempt_timeout_seconds IS NULL) OR ((attempt_timeout_seconds >= 1) AND (attempt_timeout_seconds <= (86400 * 30)))) AND ((run_timeout_seconds IS NULL) OR ((run_timeout_seconds >= 1) AND (run_timeout_seconds <= (86400 * 365)))))),
    CONSTRAINT runs_wait_reason_only_waiting CHECK (((wait_reason IS NULL) OR (status = 'waiting'::zeroth.run_status)))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_threshold='1000', autovacuum_vacuum_insert_scale_factor='0.05', autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='1000', fillfactor='70');

ALTER TABLE zeroth.runs OWNER TO zeroth_owner;

--
-- Name: TABLE runs; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.runs IS 'One row per run. Write it only through the zeroth.* functions; every lease-holder write is fenced by (lease_worker_id, lease_generation, lease_expires_at).';

--
-- Name: COLUMN runs.attempts; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.attempts IS 'Number of attempts: counted when a run starts (start_run, claim_and_start) and when an orphan is re-leased after its lease expired (claim_orphaned). Given back only by the live holder stopping gracefully: pause_run (waiting is not a failure) and the first max_attempts hand-backs (hand_back_to_pending). So attempts never exceed max_attempts through the functions.';

--
-- Name: COLUMN runs.lease_generation; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.lease_generation IS 'Fencing token: bumped by every change of owner (claim_pending, claim_orphaned); never decreases, never reset.';

--
-- Name: COLUMN runs.admission_slot; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.admission_slot IS 'The admission_slots.slot_no this lease holds when it was claimed under max_concurrency; NULL otherwise.';

--
-- Name: COLUMN runs.thread_queued_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.thread_queued_at IS 'Set while the run waits behind the active run of its thread (status waiting); the queue is ordered by it. Cleared when the run is promoted to pending or cancelled.';

--
-- Name: COLUMN runs.parent_run_id; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.parent_run_id IS 'The run of the same scope that started this one as a child run (start_child_run); NULL otherwise.';

--
-- Name: COLUMN runs.schedule_id; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.schedule_id IS 'The schedule whose fire made this run (fire_due_schedules, the only writer); NULL for every other run and for runs fired before 0018. fire_due_schedules takes an existing run under a fire''s idempotency key as that fire only when it carries the schedule''s id.';

--
-- Name: COLUMN runs.attempt_recorded_generation; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.attempt_recorded_generation IS 'The lease generation whose ended attempt zeroth._settle recorded in zeroth.run_attempts itself (the trigger runs_attempt_history skips that end); NULL or an older generation otherwise.';

--
-- Name: COLUMN runs.attempt_timeout_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.attempt_timeout_seconds IS 'This run''s own bound (whole seconds, 1 to 30 days) on an attempt''s wall time (enqueue_run / enqueue_runs), over the deployment''s; NULL: the deployment''s (zeroth.deployments.attempt_timeout_seconds), if any.';

--
-- Name: COLUMN runs.run_timeout_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.run_timeout_seconds IS 'This run''s own bound (whole seconds, 1 to 365 days) on its total time from its first claim (enqueue_run / enqueue_runs), over the deployment''s; NULL: the deployment''s, if any.';

--
-- Name: COLUMN runs.attempt_deadline_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.attempt_deadline_at IS 'The current (or last) attempt''s deadline on the database clock, fixed by the claim that leased it (claim time + the attempt timeout); the lease never runs past it. NULL: no bound.';

--
-- Name: COLUMN runs.run_deadline_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.run_deadline_at IS 'The run''s deadline on the database clock, fixed by its first claim (claim time + the run timeout) and kept by every later one; past it the run is failed for good (stop_reason run_timeout). NULL: no bound. redrive_run clears it.';

--
-- Name: COLUMN runs.code_version_id; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.code_version_id IS 'The code version of the worker that started the run, as its key (zeroth._code_version_hash; the text in zeroth.code_versions): the claim''s code_version, written by every lease of a run not yet started and kept once it started; NULL: started by an unversioned worker, or not started. Under its deployment''s version_policy (zeroth.deployments) only a worker of a version allowed to serve it resumes a started run; zeroth.retire_code_version moves it.';

--
-- Name: COLUMN runs.completed_worker_id; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.completed_worker_id IS 'The holder of the attempt that completed this run at its first claim (lease generation 1), written by zeroth._settle instead of a zeroth.run_attempt_log row; NULL otherwise (every other ended attempt is a row of the log). The view zeroth.run_attempts shows that attempt from this row: attempt runs.attempts, lease generation 1, claimed at completed_claimed_at, started at the later of started_at and that, ended at finished_at, outcome completed.';

--
-- Name: COLUMN runs.completed_claimed_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.completed_claimed_at IS 'When the attempt of completed_worker_id was claimed (its lease_acquired_at); NULL when completed_worker_id is.';

--
-- Name: COLUMN runs.checkpoint_seq; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.checkpoint_seq IS 'Number of checkpoints saved; the next checkpoint_order.';

--
-- Name: COLUMN runs.hand_backs; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.hand_backs IS 'How many times a live holder handed the run back (hand_back_to_pending). The first max_attempts hand-backs give their attempt back; later ones keep it counted, and one that finds the attempts used up dead-letters the run (stop_reason attempts_exhausted). redrive_run resets it.';

--
-- Name: COLUMN runs.resumable; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.resumable IS 'When its owner dies: true = another worker re-executes it (claim_orphaned, claim_for_takeover hands it back); false = claim_for_takeover / reconcile_thread_runs end it as failed with a stop reason (deer-flow). admit_run defaults to false for admit-and-own runs.';

--
-- Name: COLUMN runs.accounting; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.runs.accounting IS 'Caller-defined JSON object (token and message counts, …) merged by update_run_progress.';

--
-- Name: scope_limits; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.scope_limits (
    tenant_id text NOT NULL,
    workspace_id text,
    workspace_key text GENERATED ALWAYS AS (
CASE
    WHEN (workspace_id IS NULL) THEN ''::text
    ELSE ('w:'::text || workspace_id)
END) STORED NOT NULL,
    deployment_ref text NOT NULL,
    max_concurrency integer,
    weight integer DEFAULT 1 NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    note text,
    rate_limit text,
    CONSTRAINT scope_limits_deployment_nonempty CHECK ((deployment_ref <> ''::text)),
    CONSTRAINT scope_limits_max_concurrency_valid CHECK (((max_concurrency IS NULL) OR ((max_concurrency >= 1) AND (max_concurrency <= 10000)))),
    CONSTRAINT scope_limits_tenant_nonempty CHECK ((tenant_id <> ''::text)),
    CONSTRAINT scope_limits_weight_valid CHECK (((weight >= 1) AND (weight <= 1000)))
);

ALTER TABLE zeroth.scope_limits OWNER TO zeroth_owner;

--
-- Name: TABLE scope_limits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.scope_limits IS 'Per-scope limits a DBA sets in SQL: one row per (tenant, workspace, deployment) that is not run with the defaults. max_concurrency (NULL: the claimer''s own max_concurrency argument) caps the live leases of the scope fleet-wide; weight (1-1000) is its share of a multi-scope claim under a backlog; paused = true: no claim leases anything in the scope (runs keep arriving and wait). Every claim reads the row on each call. Written by zeroth_owner; zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';

--
-- Name: COLUMN scope_limits.max_concurrency; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.scope_limits.max_concurrency IS 'Live leases allowed in the scope, fleet-wide (1-10000); NULL: the claimer''s max_concurrency argument (none: unlimited).';

--
-- Name: COLUMN scope_limits.weight; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.scope_limits.weight IS 'Share of a multi-scope claim (claim_and_start_scopes) while several scopes have work: a scope of weight 2 is served twice as often as one of weight 1. Scopes without a row weigh 1.';

--
-- Name: COLUMN scope_limits.paused; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.scope_limits.paused IS 'true: nothing in the scope is leased (pending claims and orphan recovery alike) until it is false again.';

--
-- Name: COLUMN scope_limits.note; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.scope_limits.note IS 'Free text for the DBA (why the limit is there).';

--
-- Name: COLUMN scope_limits.rate_limit; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.scope_limits.rate_limit IS 'The zeroth.rate_limits key the scope''s starts count against (NULL: no rate limit). Several scopes may name one key and share its budget. A key still named here cannot be deleted.';

--
-- Name: admission_slots; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.admission_slots (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    deployment_ref text NOT NULL,
    slot_no integer NOT NULL,
    run_id uuid,
    lease_generation bigint,
    CONSTRAINT admission_slots_holder_complete CHECK (((run_id IS NULL) = (lease_generation IS NULL))),
    CONSTRAINT admission_slots_slot_positive CHECK ((slot_no >= 1))
)
WITH (fillfactor='50');

ALTER TABLE zeroth.admission_slots OWNER TO zeroth_owner;

--
-- Name: TABLE admission_slots; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.admission_slots IS 'Concurrency slots per (tenant, workspace, deployment). A slot names (run_id, lease_generation); it is held while that run holds that generation''s lease in this slot (runs.admission_slot) and the lease is live. The run row is the only copy of the lease.';

--
-- Name: run_attempt_log; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.run_attempt_log (
    tenant_id text CONSTRAINT run_attempts_tenant_id_not_null NOT NULL,
    workspace_key text CONSTRAINT run_attempts_workspace_key_not_null NOT NULL,
    run_id uuid CONSTRAINT run_attempts_run_id_not_null NOT NULL,
    attempt integer CONSTRAINT run_attempts_attempt_not_null NOT NULL,
    lease_generation bigint CONSTRAINT run_attempts_lease_generation_not_null NOT NULL,
    worker_id text CONSTRAINT run_attempts_worker_id_not_null NOT NULL,
    claimed_at timestamp with time zone,
    started_at timestamp with time zone,
    ended_at timestamp with time zone,
    outcome text,
    error jsonb,
    CONSTRAINT run_attempts_ended CHECK (((outcome IS NULL) = (ended_at IS NULL))),
    CONSTRAINT run_attempts_outcome_valid CHECK ((outcome = ANY (ARRAY['completed'::text, 'failed'::text, 'dead_lettered'::text, 'cancelled'::text, 'recovered'::text, 'expired'::text, 'lease_lost'::text, 'handed_back'::text, 'released'::text, 'slept'::text, 'paused'::text, 'waited'::text, 'timed_out'::text])))
);

ALTER TABLE zeroth.run_attempt_log OWNER TO zeroth_owner;

--
-- Name: TABLE run_attempt_log; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.run_attempt_log IS 'Attempt history, ended attempts, as stored: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed) — but for the attempt that completed a run at its first claim, kept in the run''s row (zeroth.runs.completed_worker_id). Written when the attempt ends: by the settle path (zeroth._settle) in the settling statement, and by the trigger runs_attempt_history on zeroth.runs for every other end; deleted with the run by prune_runs. Readers read zeroth.run_attempts (every ended attempt) or zeroth.attempt_history (and the open ones), the rows of the tenant named in zeroth.tenant_id.';

--
-- Name: COLUMN run_attempt_log.attempt; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.run_attempt_log.attempt IS 'runs.attempts while the attempt ran (counted when it started); a claim that never started records the number it would have counted (runs.attempts + 1). A sleep, a pause or a wait gives its attempt back, so the next attempt may carry the same number.';

--
-- Name: COLUMN run_attempt_log.outcome; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.run_attempt_log.outcome IS 'How the attempt ended (rows here are ended attempts; NULL only in zeroth.attempt_history''s open rows). completed | failed (error) | dead_lettered (error) | cancelled | recovered (its lease expired and another worker or a takeover took the run) | expired (claimed, never started, the lease lapsed) | lease_lost (lease taken or cleared outside the functions'' rules: clear_lease, a DBA) | handed_back | released | slept | paused | waited | timed_out (its attempt or run deadline passed; error: stop_reason attempt_timeout or run_timeout).';

--
-- Name: checkpoints; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.checkpoints (
    checkpoint_id uuid NOT NULL,
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    run_id uuid NOT NULL,
    checkpoint_order bigint NOT NULL,
    lease_generation bigint NOT NULL,
    data jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL
);

ALTER TABLE zeroth.checkpoints OWNER TO zeroth_owner;

--
-- Name: TABLE checkpoints; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.checkpoints IS 'Ordered checkpoints per run, written fenced by save_checkpoint; claim_orphaned hands the latest to the next owner.';

--
-- Name: child_runs; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.child_runs (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    parent_run_id uuid NOT NULL,
    step_key text NOT NULL,
    child_run_id uuid NOT NULL,
    deployment_ref text NOT NULL,
    payload jsonb NOT NULL,
    detached boolean NOT NULL,
    created_at timestamp with time zone NOT NULL,
    status zeroth.run_status,
    output jsonb,
    error jsonb,
    dead_lettered boolean DEFAULT false NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT child_runs_outcome_complete CHECK (((status IS NULL) = (finished_at IS NULL))),
    CONSTRAINT child_runs_outcome_terminal CHECK (((status IS NULL) OR (status = ANY (ARRAY['completed'::zeroth.run_status, 'failed'::zeroth.run_status, 'cancelled'::zeroth.run_status])))),
    CONSTRAINT child_runs_step_key_valid CHECK (((step_key <> ''::text) AND (length(step_key) <= 400)))
);

ALTER TABLE zeroth.child_runs OWNER TO zeroth_owner;

--
-- Name: TABLE child_runs; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.child_runs IS 'Child runs per parent and step key (start_child_run): written once by the parent''s live lease holder; the child''s terminal outcome (status, output, error, dead_lettered, finished_at) is copied in when it ends (trigger runs_child_run_finished). Deleted with the parent.';

--
-- Name: child_waits; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.child_waits (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    parent_run_id uuid NOT NULL,
    step_key text NOT NULL,
    mode text NOT NULL,
    child_run_ids uuid[] NOT NULL,
    remaining integer NOT NULL,
    created_at timestamp with time zone NOT NULL,
    met_at timestamp with time zone,
    CONSTRAINT child_waits_children_nonempty CHECK ((cardinality(child_run_ids) >= 1)),
    CONSTRAINT child_waits_mode_valid CHECK ((mode = ANY (ARRAY['all'::text, 'any'::text]))),
    CONSTRAINT child_waits_remaining_valid CHECK (((remaining >= 0) AND (remaining <= cardinality(child_run_ids))))
);

ALTER TABLE zeroth.child_waits OWNER TO zeroth_owner;

--
-- Name: TABLE child_waits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.child_waits IS 'A parent run waiting for its children (wait_for_children): the step key its result will be recorded under, the mode (all | any), the children awaited and how many are still to end (remaining); met_at once the wait was met while the parent''s row was locked (wake_due_waits wakes it). Kept until that result is recorded; deleted with the parent (prune_runs).';

--
-- Name: code_version; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.code_version (
    id boolean DEFAULT true NOT NULL,
    files_sha256 text NOT NULL,
    catalog_md5 text NOT NULL,
    package_version text NOT NULL,
    applied_at timestamp with time zone NOT NULL,
    CONSTRAINT code_version_one_row CHECK (id)
);

ALTER TABLE zeroth.code_version OWNER TO zeroth_owner;

--
-- Name: TABLE code_version; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.code_version IS 'One row: the sha256 of the sql/functions files the last upgrade applied, the md5 of the catalog''s definitions of the schema''s functions, views and triggers right after, and the zeroth-pg version that applied them (an older package refuses to put older code back). Written by zeroth_pg.migrate; readable by zeroth_owner only.';

--
-- Name: code_version_changes; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.code_version_changes (
    change_id bigint NOT NULL,
    deployment_ref text NOT NULL,
    changed_at timestamp with time zone NOT NULL,
    changed_by text NOT NULL,
    acting_role text,
    action text NOT NULL,
    version_policy text,
    compatible_versions text[],
    code_version text,
    to_version text,
    run_count integer,
    message text,
    CONSTRAINT code_version_changes_action_valid CHECK ((action = ANY (ARRAY['set_policy'::text, 'move'::text, 'fail'::text])))
);

ALTER TABLE zeroth.code_version_changes OWNER TO zeroth_owner;

--
-- Name: TABLE code_version_changes; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.code_version_changes IS 'The audit log of code versions: each zeroth.set_version_policy that changed a deployment''s version_policy (action set_policy: the new policy and set) and each zeroth.retire_code_version (action move: the runs pinned to code_version moved to to_version; fail: ended with stop_reason code_version_retired; run_count: how many), with the database time and who (changed_by: session_user; acting_role: the SET ROLE in force). Names no tenant: zeroth_reader reads every row. Nothing deletes rows but a DBA.';

--
-- Name: code_version_changes_change_id_seq; Type: SEQUENCE; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.code_version_changes ALTER COLUMN change_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME zeroth.code_version_changes_change_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: code_versions; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.code_versions (
    version_id bigint NOT NULL,
    code_version text NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    CONSTRAINT code_versions_valid CHECK (((length(code_version) <= 128) AND (code_version ~ '^[A-Za-z0-9][A-Za-z0-9._+:/-]*$'::text)))
);

ALTER TABLE zeroth.code_versions OWNER TO zeroth_owner;

--
-- Name: TABLE code_versions; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.code_versions IS 'The text of every code version a worker declared in a claim (or an operator named in retire_code_version): version_id is the first 8 bytes of sha256(code_version) (zeroth._code_version_hash), the key runs.code_version_id holds. No unique constraint, so that no claim waits on another''s insert: a version first seen by two claims at once may have two identical rows. Written only by the functions; names no tenant: zeroth_reader reads every row.';

--
-- Name: deployment_changes; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.deployment_changes (
    change_id bigint NOT NULL,
    deployment_ref text NOT NULL,
    version bigint NOT NULL,
    changed_at timestamp with time zone NOT NULL,
    changed_by text NOT NULL,
    acting_role text,
    via text NOT NULL,
    old_values jsonb,
    new_values jsonb NOT NULL,
    CONSTRAINT deployment_changes_via_valid CHECK ((via = ANY (ARRAY['register_deployment'::text, 'set_deployment_defaults'::text])))
);

ALTER TABLE zeroth.deployment_changes OWNER TO zeroth_owner;

--
-- Name: TABLE deployment_changes; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.deployment_changes IS 'The audit log of zeroth.deployments: one row per change (a creation has old_values NULL), with the deployment''s new version, the database time, who (changed_by: session_user; acting_role: the SET ROLE in force, NULL without one) and the function that made it. Registrations that change nothing write no row. zeroth.prune_runs (called for every tenant) deletes the changes older than its cutoff, keeping each deployment''s latest change; nothing else deletes rows but a DBA. zeroth_reader reads every row.';

--
-- Name: COLUMN deployment_changes.old_values; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployment_changes.old_values IS 'The defaults before the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020; attempt_timeout_seconds, run_timeout_seconds: since 0021; each only when set); NULL when the change created the row.';

--
-- Name: COLUMN deployment_changes.new_values; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.deployment_changes.new_values IS 'The defaults after the change (max_attempts, priority, managed_by, retry_base_seconds, retry_max_seconds, lease_seconds: since migration 0020; attempt_timeout_seconds, run_timeout_seconds: since 0021; each only when set).';

--
-- Name: deployment_changes_change_id_seq; Type: SEQUENCE; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.deployment_changes ALTER COLUMN change_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME zeroth.deployment_changes_change_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: event_waits; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.event_waits (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    name text NOT NULL,
    timeout_at timestamp with time zone,
    created_at timestamp with time zone NOT NULL
);

ALTER TABLE zeroth.event_waits OWNER TO zeroth_owner;

--
-- Name: TABLE event_waits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.event_waits IS 'A run waiting on an event of its scope (wait_for_event): the step key its result will be recorded under and the database time it times out (NULL: never). Kept until that result is recorded; deleted with the run.';

--
-- Name: events; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.events (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    name text NOT NULL,
    payload jsonb,
    emitted_at timestamp with time zone,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT events_emitted CHECK (((payload IS NULL) = (emitted_at IS NULL))),
    CONSTRAINT events_name_valid CHECK (((name <> ''::text) AND (length(name) <= 200)))
);

ALTER TABLE zeroth.events OWNER TO zeroth_owner;

--
-- Name: TABLE events; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.events IS 'External events of a scope by name (emit_event): payload and emitted_at are written once (first write wins). A row with emitted_at NULL is a channel a run waits on; its row lock serialises wait_for_event against emit_event. prune_runs deletes a row once it is older than its cutoff (emitted_at, or created_at of a channel) and no run waits on the name; an emit after that is a new event.';

--
-- Name: notification_secret; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.notification_secret (
    id boolean DEFAULT true NOT NULL,
    secret text NOT NULL,
    CONSTRAINT notification_secret_long CHECK ((length(secret) >= 32)),
    CONSTRAINT notification_secret_one_row CHECK (id)
);

ALTER TABLE zeroth.notification_secret OWNER TO zeroth_owner;

--
-- Name: TABLE notification_secret; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.notification_secret IS 'The per-database random secret that NOTIFY payload keys are derived from (zeroth._notify_key). Readable by zeroth_owner only.';

--
-- Name: rate_limit_starts; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.rate_limit_starts (
    name text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    starts integer NOT NULL,
    CONSTRAINT rate_limit_starts_starts_positive CHECK ((starts >= 1))
);

ALTER TABLE zeroth.rate_limit_starts OWNER TO zeroth_owner;

--
-- Name: TABLE rate_limit_starts; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.rate_limit_starts IS 'The sliding log of each rate limit: how many runs the claims started under the key at each database time, rounded up to a thousandth of the period (a start counts at most period/1000 longer, never shorter; at most about 1000 rows per key). Written by the claims only (pruned of entries older than the window by the claim itself); no role but zeroth_owner reads it.';

--
-- Name: rate_limits; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.rate_limits (
    name text NOT NULL,
    max_starts integer NOT NULL,
    period_seconds double precision NOT NULL,
    last_start_at timestamp with time zone,
    note text,
    CONSTRAINT rate_limits_max_starts_valid CHECK (((max_starts >= 1) AND (max_starts <= 1000000))),
    CONSTRAINT rate_limits_name_valid CHECK (((name <> ''::text) AND (length(name) <= 200))),
    CONSTRAINT rate_limits_period_valid CHECK (((period_seconds >= (0.001)::double precision) AND (period_seconds <= (86400)::double precision)))
);

ALTER TABLE zeroth.rate_limits OWNER TO zeroth_owner;

--
-- Name: TABLE rate_limits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.rate_limits IS 'Rate limits a DBA sets: at most max_starts starts in any rolling window of period_seconds, fleet-wide, for every scope whose zeroth.scope_limits row names the key (rate_limit). Every claim reads the row on each call. Written by zeroth_owner (zeroth.set_rate_limit or SQL); zeroth_reader sees the keys its tenant''s scopes use.';

--
-- Name: COLUMN rate_limits.max_starts; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.rate_limits.max_starts IS 'Starts allowed in any window of period_seconds (1-1000000).';

--
-- Name: COLUMN rate_limits.period_seconds; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.rate_limits.period_seconds IS 'The rolling window, in seconds (0.001-86400).';

--
-- Name: COLUMN rate_limits.last_start_at; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.rate_limits.last_start_at IS 'Kept by the claims: the database time of the last claim that started runs under the key.';

--
-- Name: COLUMN rate_limits.note; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.rate_limits.note IS 'Free text for the DBA (whose quota this is).';

--
-- Name: run_events; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.run_events (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    run_id uuid NOT NULL,
    event_id bigint NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    data jsonb NOT NULL,
    lease_generation bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    CONSTRAINT run_events_event_id_valid CHECK ((event_id >= 1)),
    CONSTRAINT run_events_kind_valid CHECK ((kind = ANY (ARRAY['event'::text, 'end'::text]))),
    CONSTRAINT run_events_name_valid CHECK (((name <> ''::text) AND (length(name) <= 200)))
);

ALTER TABLE zeroth.run_events OWNER TO zeroth_owner;

--
-- Name: TABLE run_events; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.run_events IS 'A run''s event stream: events numbered 1, 2, 3… per run in commit order (append_run_event, by the live lease holder of a running run, under the run''s row lock), each with its name, a bounded JSON payload, the lease generation that wrote it and the database time; kind ''end'' is the END written by the settle path (zeroth._settle) when a run that has events ends. read_run_events reads it (and says END for a run ended with no END row). Deleted with the run. zeroth_reader reads the rows of the tenant named in zeroth.tenant_id.';

--
-- Name: COLUMN run_events.kind; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON COLUMN zeroth.run_events.kind IS 'event (append_run_event) | end (the run ended: data holds its status and outcome).';

--
-- Name: run_steps; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.run_steps (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    run_id uuid NOT NULL,
    step_key text NOT NULL,
    result jsonb NOT NULL,
    lease_generation bigint NOT NULL,
    attempt integer NOT NULL,
    recorded_at timestamp with time zone NOT NULL,
    CONSTRAINT run_steps_step_key_valid CHECK (((step_key <> ''::text) AND (length(step_key) <= 400)))
);

ALTER TABLE zeroth.run_steps OWNER TO zeroth_owner;

--
-- Name: TABLE run_steps; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.run_steps IS 'Recorded step results per run (run.step, wait_for_event): written once per (run, step_key) by the live lease holder (record_step, wait_for_event); first recorded result wins. lease_generation and attempt say which attempt recorded it. Deleted with the run.';

--
-- Name: run_transitions; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.run_transitions (
    edge_no integer NOT NULL,
    from_status zeroth.run_status,
    outcome text NOT NULL,
    to_status zeroth.run_status,
    label text NOT NULL,
    CONSTRAINT run_transitions_outcome_check CHECK ((outcome ~ '^[a-z_]+$'::text))
);

ALTER TABLE zeroth.run_transitions OWNER TO zeroth_owner;

--
-- Name: TABLE run_transitions; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.run_transitions IS 'The run state machine as data: one row per legal edge (from_status, outcome kind, to_status; NULL = not yet created / deleted) with its diagram label. zeroth._settle settles only listed edges (an unlisted one changes nothing: ZP012); docs/state-machine.md''s diagram is generated from it.';

--
-- Name: schedule_fires; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.schedule_fires (
    schedule_id uuid NOT NULL,
    fire_at timestamp with time zone NOT NULL,
    tenant_id text NOT NULL,
    run_id uuid NOT NULL,
    fired_at timestamp with time zone NOT NULL,
    CONSTRAINT schedule_fires_finite CHECK ((isfinite(fire_at) AND isfinite(fired_at)))
);

ALTER TABLE zeroth.schedule_fires OWNER TO zeroth_owner;

--
-- Name: TABLE schedule_fires; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.schedule_fires IS 'The exactly-once record of schedules: one row per (schedule, fire time) that became a run (run_id; fired_at = database time of the firing). Rows older than 7 days are pruned by fire_due_schedules. zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';

--
-- Name: thread_locks; Type: TABLE; Schema: zeroth; Owner: zeroth_owner
--
CREATE TABLE zeroth.thread_locks (
    tenant_id text NOT NULL,
    workspace_key text NOT NULL,
    thread_id text NOT NULL
);

ALTER TABLE zeroth.thread_locks OWNER TO zeroth_owner;

--
-- Name: TABLE thread_locks; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON TABLE zeroth.thread_locks IS 'One row per thread that has been admitted to: its row lock serialises the admissions and redrives of that thread (zeroth._lock_thread). Created on first use, deleted by prune_runs once the thread has no runs left. Locked by zeroth functions only: no role but zeroth_owner can read or lock it.';

--
-- Name: admission_slots admission_slots_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.admission_slots
    ADD CONSTRAINT admission_slots_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref, slot_no);

--
-- Name: checkpoints checkpoints_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_pkey PRIMARY KEY (tenant_id, workspace_key, checkpoint_id);

--
-- Name: child_runs child_runs_child_key; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.child_runs
    ADD CONSTRAINT child_runs_child_key UNIQUE (tenant_id, workspace_key, child_run_id);

--
-- Name: child_runs child_runs_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.child_runs
    ADD CONSTRAINT child_runs_pkey PRIMARY KEY (tenant_id, workspace_key, parent_run_id, step_key);

--
-- Name: child_waits child_waits_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.child_waits
    ADD CONSTRAINT child_waits_pkey PRIMARY KEY (tenant_id, workspace_key, parent_run_id, step_key);

--
-- Name: code_version_changes code_version_changes_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.code_version_changes
    ADD CONSTRAINT code_version_changes_pkey PRIMARY KEY (change_id);

--
-- Name: code_version code_version_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.code_version
    ADD CONSTRAINT code_version_pkey PRIMARY KEY (id);

--
-- Name: deployment_changes deployment_changes_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.deployment_changes
    ADD CONSTRAINT deployment_changes_pkey PRIMARY KEY (change_id);

--
-- Name: deployment_changes deployment_changes_version_key; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.deployment_changes
    ADD CONSTRAINT deployment_changes_version_key UNIQUE (deployment_ref, version);

--
-- Name: deployments deployments_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.deployments
    ADD CONSTRAINT deployments_pkey PRIMARY KEY (deployment_ref);

--
-- Name: event_waits event_waits_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.event_waits
    ADD CONSTRAINT event_waits_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, step_key);

--
-- Name: events events_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (tenant_id, workspace_key, name);

--
-- Name: notification_secret notification_secret_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.notification_secret
    ADD CONSTRAINT notification_secret_pkey PRIMARY KEY (id);

--
-- Name: rate_limit_starts rate_limit_starts_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.rate_limit_starts
    ADD CONSTRAINT rate_limit_starts_pkey PRIMARY KEY (name, started_at);

--
-- Name: rate_limits rate_limits_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.rate_limits
    ADD CONSTRAINT rate_limits_pkey PRIMARY KEY (name);

--
-- Name: run_events run_events_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_events
    ADD CONSTRAINT run_events_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, event_id);

--
-- Name: run_steps run_steps_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_steps
    ADD CONSTRAINT run_steps_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, step_key);

--
-- Name: run_transitions run_transitions_edge_key; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_transitions
    ADD CONSTRAINT run_transitions_edge_key UNIQUE NULLS NOT DISTINCT (from_status, outcome);

--
-- Name: run_transitions run_transitions_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_transitions
    ADD CONSTRAINT run_transitions_pkey PRIMARY KEY (edge_no);

--
-- Name: runs runs_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id, tenant_id, workspace_key);

--
-- Name: runs runs_scope_names_bounded; Type: CHECK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.runs
    ADD CONSTRAINT runs_scope_names_bounded CHECK (((length(tenant_id) <= 200) AND (length(deployment_ref) <= 200) AND ((workspace_id IS NULL) OR (length(workspace_id) <= 200)))) NOT VALID;

--
-- Name: schedule_fires schedule_fires_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.schedule_fires
    ADD CONSTRAINT schedule_fires_pkey PRIMARY KEY (schedule_id, fire_at);

--
-- Name: schedules schedules_name_key; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.schedules
    ADD CONSTRAINT schedules_name_key UNIQUE (tenant_id, workspace_key, name);

--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (schedule_id);

--
-- Name: scope_limits scope_limits_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.scope_limits
    ADD CONSTRAINT scope_limits_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref);

--
-- Name: thread_locks thread_locks_pkey; Type: CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.thread_locks
    ADD CONSTRAINT thread_locks_pkey PRIMARY KEY (tenant_id, workspace_key, thread_id);

--
-- Name: admission_slots_run_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX admission_slots_run_idx ON zeroth.admission_slots USING btree (run_id) WHERE (run_id IS NOT NULL);

--
-- Name: checkpoints_run_order_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX checkpoints_run_order_idx ON zeroth.checkpoints USING btree (tenant_id, workspace_key, run_id, checkpoint_order DESC);

--
-- Name: child_waits_met; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX child_waits_met ON zeroth.child_waits USING btree (met_at) WHERE (met_at IS NOT NULL);

--
-- Name: code_versions_version_id_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX code_versions_version_id_idx ON zeroth.code_versions USING btree (version_id);

--
-- Name: deployment_changes_age_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX deployment_changes_age_idx ON zeroth.deployment_changes USING btree (changed_at);

--
-- Name: event_waits_name_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX event_waits_name_idx ON zeroth.event_waits USING btree (tenant_id, workspace_key, name);

--
-- Name: event_waits_timeout_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX event_waits_timeout_idx ON zeroth.event_waits USING btree (timeout_at) WHERE (timeout_at IS NOT NULL);

--
-- Name: events_age_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX events_age_idx ON zeroth.events USING btree (COALESCE(emitted_at, created_at));

--
-- Name: run_attempts_run_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX run_attempts_run_idx ON zeroth.run_attempt_log USING btree (tenant_id, workspace_key, run_id, lease_generation);

--
-- Name: runs_claim_pending_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_claim_pending_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, priority DESC, run_after, created_at) WHERE (status = 'pending'::zeroth.run_status);

--
-- Name: runs_code_version_active_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_code_version_active_idx ON zeroth.runs USING btree (deployment_ref, code_version_id) WHERE ((code_version_id IS NOT NULL) AND (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status, 'waiting'::zeroth.run_status])));

--
-- Name: INDEX runs_code_version_active_idx; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON INDEX zeroth.runs_code_version_active_idx IS 'The active runs of a deployment by code version (zeroth.pinned_runs, zeroth.retire_code_version). Runs without a version are not in it.';

--
-- Name: runs_code_version_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_code_version_idx ON zeroth.runs USING btree (code_version_id) WHERE (code_version_id IS NOT NULL);

--
-- Name: INDEX runs_code_version_idx; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON INDEX zeroth.runs_code_version_idx IS 'Every run that records a code version, by version (prune_runs: whether any run still references a zeroth.code_versions row). Runs without a version are not in it.';

--
-- Name: runs_created_not_running_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_created_not_running_idx ON zeroth.runs USING btree (created_at, run_id) WHERE (status <> 'running'::zeroth.run_status);

--
-- Name: INDEX runs_created_not_running_idx; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON INDEX zeroth.runs_created_not_running_idx IS 'Keyset pages of the runs that are not running by (created_at, run_id), newest first (zeroth.run_list, the dashboard''s runs page; the running runs come from runs_running_idx). Not written by a claim or a renewal.';

--
-- Name: runs_dead_letter_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_dead_letter_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, dead_lettered_at) WHERE (dead_lettered_at IS NOT NULL);

--
-- Name: runs_failed_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_failed_idx ON zeroth.runs USING btree (deployment_ref, tenant_id, workspace_id) WHERE ((status = 'failed'::zeroth.run_status) AND (dead_lettered_at IS NULL));

--
-- Name: runs_finished_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_finished_idx ON zeroth.runs USING btree (finished_at, tenant_id, workspace_key) WHERE (status = ANY (ARRAY['completed'::zeroth.run_status, 'failed'::zeroth.run_status, 'cancelled'::zeroth.run_status]));

--
-- Name: runs_idempotency_key_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE UNIQUE INDEX runs_idempotency_key_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref, idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: runs_run_deadline_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_run_deadline_idx ON zeroth.runs USING btree (run_deadline_at) WHERE ((run_deadline_at IS NOT NULL) AND (status = ANY (ARRAY['pending'::zeroth.run_status, 'waiting'::zeroth.run_status])));

--
-- Name: INDEX runs_run_deadline_idx; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON INDEX zeroth.runs_run_deadline_idx IS 'The pending and waiting runs that have a run deadline, by deadline: what zeroth.wake_due_waits reads to end those past it (issue 34 item 2).';

--
-- Name: runs_running_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_running_idx ON zeroth.runs USING btree (tenant_id, workspace_key, deployment_ref) WHERE (status = 'running'::zeroth.run_status);

--
-- Name: runs_thread_active_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE UNIQUE INDEX runs_thread_active_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id) WHERE ((thread_id IS NOT NULL) AND (status = ANY (ARRAY['pending'::zeroth.run_status, 'running'::zeroth.run_status, 'waiting'::zeroth.run_status])) AND (thread_queued_at IS NULL));

--
-- Name: INDEX runs_thread_active_idx; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON INDEX zeroth.runs_thread_active_idx IS 'At most one active (pending, running or waiting, not queued) run per thread, across all processes.';

--
-- Name: runs_thread_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_thread_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id, created_at DESC, run_id DESC) WHERE (thread_id IS NOT NULL);

--
-- Name: runs_thread_queue_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_thread_queue_idx ON zeroth.runs USING btree (tenant_id, workspace_key, thread_id, thread_queued_at, run_id) WHERE (thread_queued_at IS NOT NULL);

--
-- Name: runs_waiting_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX runs_waiting_idx ON zeroth.runs USING btree (deployment_ref, tenant_id, workspace_id) WHERE (status = 'waiting'::zeroth.run_status);

--
-- Name: schedules_due_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX schedules_due_idx ON zeroth.schedules USING btree (deployment_ref, next_fire_at) WHERE ((NOT paused) AND (next_fire_at IS NOT NULL));

--
-- Name: scope_limits_rate_limit_idx; Type: INDEX; Schema: zeroth; Owner: zeroth_owner
--
CREATE INDEX scope_limits_rate_limit_idx ON zeroth.scope_limits USING btree (rate_limit) WHERE (rate_limit IS NOT NULL);

--
-- Name: checkpoints checkpoints_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.checkpoints
    ADD CONSTRAINT checkpoints_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: child_runs child_runs_parent_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.child_runs
    ADD CONSTRAINT child_runs_parent_fkey FOREIGN KEY (tenant_id, workspace_key, parent_run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: event_waits event_waits_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.event_waits
    ADD CONSTRAINT event_waits_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: rate_limit_starts rate_limit_starts_name_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.rate_limit_starts
    ADD CONSTRAINT rate_limit_starts_name_fkey FOREIGN KEY (name) REFERENCES zeroth.rate_limits(name) ON UPDATE CASCADE ON DELETE CASCADE;

--
-- Name: run_events run_events_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_events
    ADD CONSTRAINT run_events_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: run_steps run_steps_run_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.run_steps
    ADD CONSTRAINT run_steps_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id) REFERENCES zeroth.runs(tenant_id, workspace_key, run_id) ON DELETE CASCADE;

--
-- Name: schedule_fires schedule_fires_schedule_id_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.schedule_fires
    ADD CONSTRAINT schedule_fires_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES zeroth.schedules(schedule_id) ON DELETE CASCADE;

--
-- Name: scope_limits scope_limits_rate_limit_fkey; Type: FK CONSTRAINT; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE ONLY zeroth.scope_limits
    ADD CONSTRAINT scope_limits_rate_limit_fkey FOREIGN KEY (rate_limit) REFERENCES zeroth.rate_limits(name) ON UPDATE CASCADE ON DELETE RESTRICT;

--
-- Name: admission_slots; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.admission_slots ENABLE ROW LEVEL SECURITY;

--
-- Name: checkpoints; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.checkpoints ENABLE ROW LEVEL SECURITY;

--
-- Name: checkpoints checkpoints_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY checkpoints_reader_tenant ON zeroth.checkpoints FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY checkpoints_reader_tenant ON checkpoints; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY checkpoints_reader_tenant ON zeroth.checkpoints IS 'zeroth_reader sees the checkpoints of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: child_runs; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.child_runs ENABLE ROW LEVEL SECURITY;

--
-- Name: child_runs child_runs_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY child_runs_reader_tenant ON zeroth.child_runs FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY child_runs_reader_tenant ON child_runs; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY child_runs_reader_tenant ON zeroth.child_runs IS 'zeroth_reader sees the child runs of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: child_waits; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.child_waits ENABLE ROW LEVEL SECURITY;

--
-- Name: code_version; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.code_version ENABLE ROW LEVEL SECURITY;

--
-- Name: code_version_changes; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.code_version_changes ENABLE ROW LEVEL SECURITY;

--
-- Name: code_version_changes code_version_changes_reader_all; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY code_version_changes_reader_all ON zeroth.code_version_changes FOR SELECT TO zeroth_reader USING (true);

--
-- Name: POLICY code_version_changes_reader_all ON code_version_changes; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY code_version_changes_reader_all ON zeroth.code_version_changes IS 'zeroth_reader sees every change: a deployment is global and the log names no tenant.';

--
-- Name: code_versions; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.code_versions ENABLE ROW LEVEL SECURITY;

--
-- Name: code_versions code_versions_reader_all; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY code_versions_reader_all ON zeroth.code_versions FOR SELECT TO zeroth_reader USING (true);

--
-- Name: POLICY code_versions_reader_all ON code_versions; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY code_versions_reader_all ON zeroth.code_versions IS 'zeroth_reader sees every version: a label of code, it names no tenant.';

--
-- Name: deployment_changes; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.deployment_changes ENABLE ROW LEVEL SECURITY;

--
-- Name: deployment_changes deployment_changes_reader_all; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY deployment_changes_reader_all ON zeroth.deployment_changes FOR SELECT TO zeroth_reader USING (true);

--
-- Name: POLICY deployment_changes_reader_all ON deployment_changes; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY deployment_changes_reader_all ON zeroth.deployment_changes IS 'zeroth_reader sees every change: the registry is global and names no tenant.';

--
-- Name: deployments; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.deployments ENABLE ROW LEVEL SECURITY;

--
-- Name: deployments deployments_reader_all; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY deployments_reader_all ON zeroth.deployments FOR SELECT TO zeroth_reader USING (true);

--
-- Name: POLICY deployments_reader_all ON deployments; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY deployments_reader_all ON zeroth.deployments IS 'zeroth_reader sees every deployment: the registry is global and names no tenant.';

--
-- Name: event_waits; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.event_waits ENABLE ROW LEVEL SECURITY;

--
-- Name: event_waits event_waits_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY event_waits_reader_tenant ON zeroth.event_waits FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY event_waits_reader_tenant ON event_waits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY event_waits_reader_tenant ON zeroth.event_waits IS 'zeroth_reader sees the event waits of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: events; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.events ENABLE ROW LEVEL SECURITY;

--
-- Name: events events_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY events_reader_tenant ON zeroth.events FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY events_reader_tenant ON events; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY events_reader_tenant ON zeroth.events IS 'zeroth_reader sees the events of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: notification_secret; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.notification_secret ENABLE ROW LEVEL SECURITY;

--
-- Name: rate_limit_starts; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.rate_limit_starts ENABLE ROW LEVEL SECURITY;

--
-- Name: rate_limits; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.rate_limits ENABLE ROW LEVEL SECURITY;

--
-- Name: rate_limits rate_limits_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY rate_limits_reader_tenant ON zeroth.rate_limits FOR SELECT TO zeroth_reader USING ((EXISTS ( SELECT 1
   FROM zeroth.scope_limits l
  WHERE ((l.rate_limit = rate_limits.name) AND (l.tenant_id = current_setting('zeroth.tenant_id'::text, true))))));

--
-- Name: POLICY rate_limits_reader_tenant ON rate_limits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY rate_limits_reader_tenant ON zeroth.rate_limits IS 'zeroth_reader sees the keys named by a scope of the tenant in the setting zeroth.tenant_id (none when unset).';

--
-- Name: run_attempt_log; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.run_attempt_log ENABLE ROW LEVEL SECURITY;

--
-- Name: run_attempt_log run_attempts_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY run_attempts_reader_tenant ON zeroth.run_attempt_log FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY run_attempts_reader_tenant ON run_attempt_log; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY run_attempts_reader_tenant ON zeroth.run_attempt_log IS 'zeroth_reader sees the attempts of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: run_events; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.run_events ENABLE ROW LEVEL SECURITY;

--
-- Name: run_events run_events_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY run_events_reader_tenant ON zeroth.run_events FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY run_events_reader_tenant ON run_events; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY run_events_reader_tenant ON zeroth.run_events IS 'zeroth_reader sees the run events of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: run_steps; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.run_steps ENABLE ROW LEVEL SECURITY;

--
-- Name: run_steps run_steps_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY run_steps_reader_tenant ON zeroth.run_steps FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY run_steps_reader_tenant ON run_steps; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY run_steps_reader_tenant ON zeroth.run_steps IS 'zeroth_reader sees the step results of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: run_transitions; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.run_transitions ENABLE ROW LEVEL SECURITY;

--
-- Name: runs; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.runs ENABLE ROW LEVEL SECURITY;

--
-- Name: runs runs_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY runs_reader_tenant ON zeroth.runs FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY runs_reader_tenant ON runs; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY runs_reader_tenant ON zeroth.runs IS 'zeroth_reader sees the runs of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: schedule_fires; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.schedule_fires ENABLE ROW LEVEL SECURITY;

--
-- Name: schedule_fires schedule_fires_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY schedule_fires_reader_tenant ON zeroth.schedule_fires FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY schedule_fires_reader_tenant ON schedule_fires; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY schedule_fires_reader_tenant ON zeroth.schedule_fires IS 'zeroth_reader sees the fires of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: schedules; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.schedules ENABLE ROW LEVEL SECURITY;

--
-- Name: schedules schedules_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY schedules_reader_tenant ON zeroth.schedules FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY schedules_reader_tenant ON schedules; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY schedules_reader_tenant ON zeroth.schedules IS 'zeroth_reader sees the schedules of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: scope_limits; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.scope_limits ENABLE ROW LEVEL SECURITY;

--
-- Name: scope_limits scope_limits_reader_tenant; Type: POLICY; Schema: zeroth; Owner: zeroth_owner
--
CREATE POLICY scope_limits_reader_tenant ON zeroth.scope_limits FOR SELECT TO zeroth_reader USING ((tenant_id = current_setting('zeroth.tenant_id'::text, true)));

--
-- Name: POLICY scope_limits_reader_tenant ON scope_limits; Type: COMMENT; Schema: zeroth; Owner: zeroth_owner
--
COMMENT ON POLICY scope_limits_reader_tenant ON zeroth.scope_limits IS 'zeroth_reader sees the limits of the tenant named in the setting zeroth.tenant_id (none when unset).';

--
-- Name: thread_locks; Type: ROW SECURITY; Schema: zeroth; Owner: zeroth_owner
--
ALTER TABLE zeroth.thread_locks ENABLE ROW LEVEL SECURITY;

--
-- Name: SCHEMA zeroth; Type: ACL; Schema: -; Owner: zeroth_owner
--
GRANT USAGE ON SCHEMA zeroth TO zeroth_worker;
GRANT USAGE ON SCHEMA zeroth TO zeroth_reader;

--
-- Name: TABLE deployments; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.deployments TO zeroth_reader;

--
-- Name: TABLE schedules; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.schedules TO zeroth_reader;

--
-- Name: TABLE runs; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.runs TO zeroth_reader;

--
-- Name: TABLE scope_limits; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.scope_limits TO zeroth_reader;

--
-- Name: TABLE run_attempt_log; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.run_attempt_log TO zeroth_reader;

--
-- Name: TABLE checkpoints; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.checkpoints TO zeroth_reader;

--
-- Name: TABLE child_runs; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.child_runs TO zeroth_reader;

--
-- Name: TABLE code_version_changes; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.code_version_changes TO zeroth_reader;

--
-- Name: TABLE code_versions; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.code_versions TO zeroth_reader;

--
-- Name: TABLE deployment_changes; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.deployment_changes TO zeroth_reader;

--
-- Name: TABLE event_waits; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.event_waits TO zeroth_reader;

--
-- Name: TABLE events; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.events TO zeroth_reader;

--
-- Name: COLUMN rate_limits.name; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT(name) ON TABLE zeroth.rate_limits TO zeroth_reader;

--
-- Name: COLUMN rate_limits.max_starts; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT(max_starts) ON TABLE zeroth.rate_limits TO zeroth_reader;

--
-- Name: COLUMN rate_limits.period_seconds; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT(period_seconds) ON TABLE zeroth.rate_limits TO zeroth_reader;

--
-- Name: COLUMN rate_limits.note; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT(note) ON TABLE zeroth.rate_limits TO zeroth_reader;

--
-- Name: TABLE run_events; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.run_events TO zeroth_reader;

--
-- Name: TABLE run_steps; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.run_steps TO zeroth_reader;

--
-- Name: TABLE schedule_fires; Type: ACL; Schema: zeroth; Owner: zeroth_owner
--
GRANT SELECT ON TABLE zeroth.schedule_fires TO zeroth_reader;
