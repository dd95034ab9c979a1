-- 0015_attempt_history: one row per attempt of a run (issue 16, part 4).
--
--   * zeroth.run_attempts: who held which lease generation of a run, when it was claimed, started
--     and ended, and how it ended. Written only by the trigger runs_attempt_history
--     (sql/functions/triggers.sql → zeroth._record_attempt in sql/functions/internal/attempts.sql),
--     which fires on the updates of zeroth.runs that change status, lease_generation or
--     lease_worker_id: every path that claims, starts or ends an attempt is covered without any
--     function writing the history itself, and renewals, progress and checkpoints pay nothing.
--   * No foreign key to zeroth.runs: a key would make every insert check the run's row and every
--     delete of a run scan the history; prune_runs deletes a run's history in the statement that
--     deletes the run instead. One index, (scope, run, generation): the trigger closes an attempt
--     by it, prune deletes by it, a reader lists a run's attempts by it. Not unique: a DBA's
--     manual UPDATE (a run set back to running in the same generation) adds a row, never raises.
--   * zeroth_reader reads it through zeroth.attempt_history (security_invoker) under a policy
--     like that of zeroth.runs: the rows of the tenant named in the setting zeroth.tenant_id.

CREATE TABLE zeroth.run_attempts (
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    run_id           uuid        NOT NULL,
    attempt          integer     NOT NULL,
    lease_generation bigint      NOT NULL,
    worker_id        text        NOT NULL,
    claimed_at       timestamptz,
    started_at       timestamptz,
    ended_at         timestamptz,
    outcome          text,
    error            jsonb,
    CONSTRAINT run_attempts_outcome_valid CHECK (outcome IN (
        'completed', 'failed', 'dead_lettered', 'cancelled', 'recovered', 'expired', 'lease_lost',
        'handed_back', 'released', 'slept', 'paused', 'waited')),
    CONSTRAINT run_attempts_ended CHECK ((outcome IS NULL) = (ended_at IS NULL))
) WITH (fillfactor = 90);  -- room for the HOT update that starts and the one that ends an attempt
COMMENT ON TABLE zeroth.run_attempts IS 'Attempt history: one row per lease generation of a run (a claim), with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed). Written only by the trigger runs_attempt_history on zeroth.runs; deleted with the run by prune_runs. zeroth_reader reads it through zeroth.attempt_history, the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.run_attempts.attempt IS 'runs.attempts when the attempt started (or was claimed, when it never started): a sleep, a pause or a wait gives its attempt back, so the next attempt may carry the same number.';
COMMENT ON COLUMN zeroth.run_attempts.outcome IS 'How the attempt ended; NULL while it is open. completed | failed (error) | dead_lettered (error) | cancelled | recovered (its lease expired and another worker or a takeover took the run) | expired (claimed, never started, the lease lapsed) | lease_lost (lease taken or cleared outside the functions'' rules: clear_lease, a DBA) | handed_back | released | slept | paused | waited.';
ALTER TABLE zeroth.run_attempts OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_attempts ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.run_attempts FROM PUBLIC;
CREATE INDEX run_attempts_run_idx ON zeroth.run_attempts (tenant_id, workspace_key, run_id, lease_generation);

CREATE POLICY run_attempts_reader_tenant ON zeroth.run_attempts FOR SELECT TO zeroth_reader
    USING (tenant_id = pg_catalog.current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY run_attempts_reader_tenant ON zeroth.run_attempts IS 'zeroth_reader sees the attempts of the tenant named in the setting zeroth.tenant_id (none when unset).';
GRANT SELECT ON zeroth.run_attempts TO zeroth_reader;
