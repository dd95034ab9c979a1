-- 0016_attempt_history: one row per attempt of a run (issue 16, part 4).
--
--   * zeroth.run_attempts: the ended attempts of a run — who held which lease generation, when it
--     was claimed, started and ended, and how it ended. Written only by the trigger
--     runs_attempt_history (sql/functions/triggers.sql → zeroth._record_attempt in
--     sql/functions/internal/attempts.sql), one INSERT by the update of zeroth.runs that ends an
--     attempt (clears or changes the holder, bumps the generation, ends the run): every path is
--     covered without any function writing the history itself. Claims, start_run, renewals,
--     progress and checkpoints write nothing: the open attempt is the run's own row, and
--     zeroth.attempt_history shows it from there.
--   * No foreign key to zeroth.runs: a key would make every insert check the run's row and every
--     delete of a run scan the history; prune_runs deletes a run's history in the statement that
--     deletes the run instead. One index, (scope, run, generation): prune deletes by it, a reader
--     lists a run's attempts by it. Not unique: after a lossy asynchronous failover a generation
--     can be handed out twice, and a DBA's manual UPDATE may end an attempt twice; the trigger
--     adds a row and never raises.
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
);  -- insert-only: no room kept for updates
COMMENT ON TABLE zeroth.run_attempts IS 'Attempt history, ended attempts: one row per lease generation of a run (a claim) once it ended, with its holder, attempt number, when it was claimed, started and ended, and how it ended (outcome; error when it failed). Inserted only by the trigger runs_attempt_history on zeroth.runs when the attempt ends (the open attempt is the runs row); deleted with the run by prune_runs. zeroth_reader reads it through zeroth.attempt_history, the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.run_attempts.attempt IS 'runs.attempts while the attempt ran (counted when it started); a claim that never started records the number it would have counted (runs.attempts + 1). A sleep, a pause or a wait gives its attempt back, so the next attempt may carry the same number.';
COMMENT ON COLUMN zeroth.run_attempts.outcome IS 'How the attempt ended (rows here are ended attempts; NULL only in zeroth.attempt_history''s open rows). completed | failed (error) | dead_lettered (error) | cancelled | recovered (its lease expired and another worker or a takeover took the run) | expired (claimed, never started, the lease lapsed) | lease_lost (lease taken or cleared outside the functions'' rules: clear_lease, a DBA) | handed_back | released | slept | paused | waited.';
ALTER TABLE zeroth.run_attempts OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_attempts ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.run_attempts FROM PUBLIC;
CREATE INDEX run_attempts_run_idx ON zeroth.run_attempts (tenant_id, workspace_key, run_id, lease_generation);

CREATE POLICY run_attempts_reader_tenant ON zeroth.run_attempts FOR SELECT TO zeroth_reader
    USING (tenant_id = pg_catalog.current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY run_attempts_reader_tenant ON zeroth.run_attempts IS 'zeroth_reader sees the attempts of the tenant named in the setting zeroth.tenant_id (none when unset).';
GRANT SELECT ON zeroth.run_attempts TO zeroth_reader;
