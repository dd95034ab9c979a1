-- 0019_day_one: state changes for the work of the session of 2026-12-05 (afternoon): performance
-- on day one (issue 30), the first hour and the operator's day (issue 31), the test suite (32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- Issue 30, item 3 (a hot path that costs what a queue should): no unconditional index on
-- zeroth.runs for the dashboard's sake. Every claim and every completion changes `status`, which
-- the partial indexes name, so each is a non-HOT update and inserts an entry into every index
-- whose predicate its new row version meets; runs_created_idx (created_at, run_id) and
-- runs_run_id_idx (run_id) (0015) met every row version, six of the thirteen index entries a run
-- cost (enqueue, claim, completion). Instead:
--   * runs_created_not_running_idx: (created_at, run_id) of the runs that are not running. A run
--     enters it when it is enqueued (pending) and again when it ends; the claim, which makes it
--     running, and the renewals leave it alone. A keyset page of zeroth.run_list (the dashboard,
--     `zeroth-pg runs list`) is two queries merged, each with the page's LIMIT: the runs that are
--     not running (a backward walk of this index) and the running ones (runs_running_idx, as
--     many as there are live leases, sorted): O(page + running runs) at millions of runs
--     (tests/plans/test_run_list_plan.py, tests/plans/test_hot_path_indexes.py).
--   * runs_run_id_not_running_idx: run_id of the runs that are not running, for a run known by
--     its id alone (the dashboard's run page, search and bulk actions, `zeroth-pg runs show`),
--     written as the index above (at enqueue and at the end, never by a claim or a renewal); a
--     running run by its id is found among the running ones (runs_running_idx). A probe per
--     scope of runs_pkey instead (no index at all) cost about 14 blocks a scope: at 100 tenants a
--     lookup read as many blocks as a table of 50,000 runs. zeroth.attempt_history gains
--     workspace_key so that one run's attempts are read by (tenant_id, workspace_key, run_id).
-- Per run from enqueue to completion: 11 index entries instead of 13 (bench/per_run_cost.py).
CREATE INDEX runs_created_not_running_idx ON zeroth.runs (created_at, run_id)
    WHERE status <> 'running';
COMMENT ON INDEX zeroth.runs_created_not_running_idx IS 'Keyset pages of the runs that are not running by (created_at, run_id), newest first (zeroth.run_list, the dashboard''s runs page; the running runs come from runs_running_idx). Not written by a claim or a renewal.';
CREATE INDEX runs_run_id_not_running_idx ON zeroth.runs (run_id) WHERE status <> 'running';
COMMENT ON INDEX zeroth.runs_run_id_not_running_idx IS 'A run by its id alone when it is not running (zeroth_pg._calls.run_by_id: the dashboard''s run page, search and bulk actions; the running ones come from runs_running_idx). Not written by a claim or a renewal.';
DROP INDEX zeroth.runs_created_idx;
DROP INDEX zeroth.runs_run_id_idx;

-- Issue 31, item 8 (build: "Deployment defaults in SQL"): a registry of deployments, so that a run
-- enqueued from psql, Node, the CLI or Python without max_attempts / priority gets the values its
-- application declared, not the SQL fallback (3 attempts, priority 0).
--
--   * zeroth.deployments: one row per deployment_ref, for every scope. A deployment is code (one
--     handler, the same for each tenant: a fleet worker serves it in every scope), so its defaults
--     are global; what differs per scope (max_concurrency, paused, weight, rate limit) stays in
--     zeroth.scope_limits, its one home. enqueue_run / enqueue_runs read the row by its primary
--     key only when the caller left max_attempts or priority NULL; a run keeps what it got.
--     managed_by 'app': written by zeroth.register_deployment (an App at start; the last
--     registration wins, audited); 'sql': set by a DBA (zeroth.set_deployment_defaults), which
--     an application's registration never overwrites.
--   * zeroth.deployment_changes: the audit log, one row per change of a deployment's defaults
--     (who: session_user and the SET ROLE in force; when; old → new; through which function).
--     Registrations that change nothing write nothing, so restarts do not grow it.
-- Neither holds run data or a tenant's name: zeroth_reader reads every row of both (a policy
-- USING true: row-level security is on for every table, as for every other one of the schema);
-- zeroth_worker reads through zeroth.list_deployments.
CREATE TABLE zeroth.deployments (
    deployment_ref text        NOT NULL,
    max_attempts   integer     NOT NULL,
    priority       integer     NOT NULL,
    managed_by     text        NOT NULL,
    version        bigint      NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    updated_by     text        NOT NULL,
    registered_by  text,
    CONSTRAINT deployments_pkey PRIMARY KEY (deployment_ref),
    CONSTRAINT deployments_ref_valid CHECK (deployment_ref <> '' AND length(deployment_ref) <= 200),
    CONSTRAINT deployments_max_attempts_valid CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT deployments_managed_by_valid CHECK (managed_by IN ('app', 'sql')),
    CONSTRAINT deployments_version_positive CHECK (version >= 1)
);
COMMENT ON TABLE zeroth.deployments IS 'The registry of deployments: the defaults every client''s enqueue_run / enqueue_runs (and child runs that pass none; a schedule stores its own values) give a run of the deployment when the caller passes NULL; an explicit value wins, and a run keeps the values it was enqueued with. Global (a deployment is code, the same in every scope); per-scope limits live in zeroth.scope_limits. Written only through zeroth.register_deployment (an application, managed_by app) and zeroth.set_deployment_defaults (a DBA, managed_by sql); every change is in zeroth.deployment_changes. zeroth_reader reads every row.';
COMMENT ON COLUMN zeroth.deployments.max_attempts IS 'Attempts of a run enqueued without max_attempts (1-1000).';
COMMENT ON COLUMN zeroth.deployments.priority IS 'Priority of a run enqueued without priority (higher is claimed first).';
COMMENT ON COLUMN zeroth.deployments.managed_by IS 'app: the last application registration (zeroth.register_deployment) decides; sql: a DBA set it (zeroth.set_deployment_defaults) and registrations keep it.';
COMMENT ON COLUMN zeroth.deployments.version IS '1 when created, + 1 with every change (the version of zeroth.deployment_changes that made the row as it is).';
COMMENT ON COLUMN zeroth.deployments.registered_by IS 'The login (session_user) whose application registered the row (managed_by app): only that login''s registrations change it, another''s are kept (one trust domain''s worker role cannot set the defaults of another''s runs). NULL: a DBA set the row or handed it back (set_deployment_defaults), and the next registration takes it.';
COMMENT ON COLUMN zeroth.deployments.updated_by IS 'session_user of the last change (the SET ROLE in force, if any, is in zeroth.deployment_changes).';
ALTER TABLE zeroth.deployments OWNER TO zeroth_owner;
ALTER TABLE zeroth.deployments ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.deployments FROM PUBLIC;
GRANT SELECT ON zeroth.deployments TO zeroth_reader;
CREATE POLICY deployments_reader_all ON zeroth.deployments FOR SELECT TO zeroth_reader USING (true);
COMMENT ON POLICY deployments_reader_all ON zeroth.deployments IS 'zeroth_reader sees every deployment: the registry is global and names no tenant.';

CREATE TABLE zeroth.deployment_changes (
    change_id      bigint      GENERATED ALWAYS AS IDENTITY,
    deployment_ref text        NOT NULL,
    version        bigint      NOT NULL,
    changed_at     timestamptz NOT NULL,
    changed_by     text        NOT NULL,
    acting_role    text,
    via            text        NOT NULL,
    old_values     jsonb,
    new_values     jsonb       NOT NULL,
    CONSTRAINT deployment_changes_pkey PRIMARY KEY (change_id),
    CONSTRAINT deployment_changes_version_key UNIQUE (deployment_ref, version),
    CONSTRAINT deployment_changes_via_valid CHECK (via IN ('register_deployment', 'set_deployment_defaults'))
);
COMMENT ON TABLE zeroth.deployment_changes IS 'The audit log of zeroth.deployments: one row per change (a creation has old_values NULL), with the deployment''s new version, the database time, who (changed_by: session_user; acting_role: the SET ROLE in force, NULL without one) and the function that made it. Registrations that change nothing write no row. Nothing deletes rows but a DBA; zeroth_reader reads every row.';
COMMENT ON COLUMN zeroth.deployment_changes.old_values IS 'The defaults before the change (max_attempts, priority, managed_by); NULL when the change created the row.';
COMMENT ON COLUMN zeroth.deployment_changes.new_values IS 'The defaults after the change (max_attempts, priority, managed_by).';
ALTER TABLE zeroth.deployment_changes OWNER TO zeroth_owner;
ALTER TABLE zeroth.deployment_changes ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.deployment_changes FROM PUBLIC;
GRANT SELECT ON zeroth.deployment_changes TO zeroth_reader;
CREATE POLICY deployment_changes_reader_all ON zeroth.deployment_changes FOR SELECT TO zeroth_reader
    USING (true);
COMMENT ON POLICY deployment_changes_reader_all ON zeroth.deployment_changes IS 'zeroth_reader sees every change: the registry is global and names no tenant.';
CREATE TYPE zeroth.deployment_registration AS (
    outcome        text,
    deployment_ref text,
    max_attempts   integer,
    priority       integer,
    managed_by     text,
    version        bigint,
    previous       jsonb
);
COMMENT ON TYPE zeroth.deployment_registration IS 'The result of register_deployment / set_deployment_defaults: outcome (created, updated, unchanged, kept) and the deployment''s defaults as they now are; previous: the values an update replaced (max_attempts, priority, managed_by), else NULL.';
ALTER TYPE zeroth.deployment_registration OWNER TO zeroth_owner;
