-- 0010_scope_limits: one fleet for many scopes (issue 14). A DBA sets per-scope limits in SQL, and
-- a claim can serve many deployments and scopes in one statement, fairly.
--
--   * zeroth.scope_limits: (tenant, workspace, deployment) → max_concurrency, weight, paused. Read
--     by every claim (claim_pending, claim_and_start, claim_orphaned, claim_and_start_scopes) on
--     its next call, so a changed row takes effect fleet-wide without a worker restart. Written
--     by zeroth_owner (a DBA); readable by zeroth_reader for its tenant (like zeroth.runs).
--   * zeroth.scope_claimed_run: a row of claim_and_start_scopes, a claimed_run with its scope.
--
-- No index is added to zeroth.runs: the multi-scope claim finds the scopes that have pending runs
-- by a skip scan of runs_claim_pending_idx (one probe per such scope), not by a table of its own
-- that every enqueue and every claim would have to keep up to date.

CREATE TABLE zeroth.scope_limits (
    tenant_id       text    NOT NULL,
    workspace_id    text,
    workspace_key   text    GENERATED ALWAYS AS (
                                CASE WHEN workspace_id IS NULL THEN '' ELSE 'w:' || workspace_id END
                            ) STORED NOT NULL,
    deployment_ref  text    NOT NULL,
    max_concurrency integer,
    weight          integer NOT NULL DEFAULT 1,
    paused          boolean NOT NULL DEFAULT false,
    note            text,
    CONSTRAINT scope_limits_pkey PRIMARY KEY (tenant_id, workspace_key, deployment_ref),
    CONSTRAINT scope_limits_tenant_nonempty CHECK (tenant_id <> ''),
    CONSTRAINT scope_limits_deployment_nonempty CHECK (deployment_ref <> ''),
    CONSTRAINT scope_limits_max_concurrency_valid
        CHECK (max_concurrency IS NULL OR max_concurrency BETWEEN 1 AND 10000),
    CONSTRAINT scope_limits_weight_valid CHECK (weight BETWEEN 1 AND 1000)
);
COMMENT ON TABLE zeroth.scope_limits IS 'Per-scope limits a DBA sets in SQL: one row per (tenant, workspace, deployment) that is not run with the defaults. max_concurrency (NULL: the claimer''s own max_concurrency argument) caps the live leases of the scope fleet-wide; weight (1-1000) is its share of a multi-scope claim under a backlog; paused = true: no claim leases anything in the scope (runs keep arriving and wait). Every claim reads the row on each call. Written by zeroth_owner; zeroth_reader sees the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.scope_limits.max_concurrency IS 'Live leases allowed in the scope, fleet-wide (1-10000); NULL: the claimer''s max_concurrency argument (none: unlimited).';
COMMENT ON COLUMN zeroth.scope_limits.weight IS 'Share of a multi-scope claim (claim_and_start_scopes) while several scopes have work: a scope of weight 2 is served twice as often as one of weight 1. Scopes without a row weigh 1.';
COMMENT ON COLUMN zeroth.scope_limits.paused IS 'true: nothing in the scope is leased (pending claims and orphan recovery alike) until it is false again.';
COMMENT ON COLUMN zeroth.scope_limits.note IS 'Free text for the DBA (why the limit is there).';
ALTER TABLE zeroth.scope_limits OWNER TO zeroth_owner;
ALTER TABLE zeroth.scope_limits ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.scope_limits FROM PUBLIC;
GRANT SELECT ON zeroth.scope_limits TO zeroth_reader;
CREATE POLICY scope_limits_reader_tenant ON zeroth.scope_limits FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY scope_limits_reader_tenant ON zeroth.scope_limits IS 'zeroth_reader sees the limits of the tenant named in the setting zeroth.tenant_id (none when unset).';

CREATE TYPE zeroth.scope_claimed_run AS (
    tenant_id              text,
    workspace_id           text,
    deployment_ref         text,
    run_id                 uuid,
    lease_generation       bigint,
    lease_expires_at       timestamptz,
    status                 zeroth.run_status,
    attempts               integer,
    max_attempts           integer,
    priority               integer,
    thread_id              text,
    idempotency_key        text,
    payload                jsonb,
    metadata               jsonb,
    recovery_checkpoint_id uuid,
    checkpoint_data        jsonb,
    cancel_requested       boolean,
    active_count           integer,
    concurrency_saturated  boolean,
    concurrency_limit      integer
);
COMMENT ON TYPE zeroth.scope_claimed_run IS 'A row of claim_and_start_scopes: a claimed run with its scope (tenant, workspace, deployment), or a row with run_id NULL per scope that had claimable work but no free slot (saturated, or paused: concurrency_limit 0).';
ALTER TYPE zeroth.scope_claimed_run OWNER TO zeroth_owner;
