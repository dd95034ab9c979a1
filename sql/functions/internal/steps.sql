-- sql/functions/internal/steps.sql: what the step and event functions share.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- ZP008 unless step_key is a usable step key: non-empty, at most 400 characters (a name of up to
-- 200 plus the numbering and prefixes the clients add).
CREATE OR REPLACE FUNCTION zeroth._require_step_key(step_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF step_key IS NULL OR step_key = '' OR length(step_key) > 400 THEN
        RAISE EXCEPTION 'step_key must be a non-empty string of at most 400 characters'
            USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require_step_key(text) IS 'Internal: ZP008 unless step_key is non-empty and at most 400 characters.';
ALTER FUNCTION zeroth._require_step_key(text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_step_key(text) FROM PUBLIC;

-- The attempt number of the run while (worker_id, generation) holds its live lease at `at` and it
-- is running; NULL otherwise. The fence of every step write and read, in one statement's
-- snapshot: a later generation's rows are never visible to a statement that still sees this one.
CREATE OR REPLACE FUNCTION zeroth._step_holder_attempt(tenant_id text, workspace_key text, run_id uuid,
                                                       worker_id text, generation bigint, at timestamptz)
    RETURNS integer
    -- PL/pgSQL for the reason zeroth._notify gives (record_step, start_child_run,
    -- wait_for_event and wait_for_children check here). The status is returned, not filtered:
    -- a predicate on it let a plan kept for the session reach the run through runs_running_idx
    -- and walk every running run of the scope (zeroth._lock_leased_run's header).
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT CASE WHEN r.status = 'running' THEN r.attempts END
              FROM zeroth.runs r
             WHERE r.tenant_id = _step_holder_attempt.tenant_id
               AND r.workspace_key = _step_holder_attempt.workspace_key
               AND r.run_id = _step_holder_attempt.run_id
               AND r.lease_worker_id = _step_holder_attempt.worker_id
               AND r.lease_generation = _step_holder_attempt.generation
               AND r.lease_expires_at >= _step_holder_attempt.at);
END
$$;
COMMENT ON FUNCTION zeroth._step_holder_attempt(text, text, uuid, text, bigint, timestamptz) IS 'Internal: the run''s attempt count while (worker_id, generation) holds its live lease at `at` and it is running; NULL otherwise.';
ALTER FUNCTION zeroth._step_holder_attempt(text, text, uuid, text, bigint, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._step_holder_attempt(text, text, uuid, text, bigint, timestamptz) FROM PUBLIC;

-- The holder's running run leaves its worker to wait (wait_for_event, wait_for_children): running
-- → waiting with wait_reason, or → cancelled when a cancel request is pending (as in sleep_run);
-- the lease, slot and attempt are given back (waiting is not a failure, as pause_run). The settle
-- path (zeroth._settle_one, kind wait) at `at`, the time the caller read after its lock of the
-- same rows (zeroth._lock_settle, taken again here without waiting). Notifies zeroth_wakeup when a
-- slot was freed. Returns the new status (waiting | cancelled), NULL when fenced out; raises ZP003
-- when the caller holds the live lease but the edge is not listed (zeroth._raise_unlisted_edge).
CREATE OR REPLACE FUNCTION zeroth._leave_for_wait(tenant_id text, workspace_key text, run_id uuid,
                                                  worker_id text, generation bigint, wait_reason text,
                                                  at timestamptz)
    RETURNS zeroth.run_status
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_end record;
BEGIN
    v_end := zeroth._settle_one(_leave_for_wait.tenant_id, _leave_for_wait.workspace_key,
                                _leave_for_wait.run_id, _leave_for_wait.worker_id,
                                _leave_for_wait.generation, 'wait', reason => _leave_for_wait.wait_reason,
                                at => _leave_for_wait.at);
    -- The caller's live lease but no listed edge (a DBA removed running → waiting, or running →
    -- cancelled with a cancel request pending): ZP003, never a NULL the caller would report as
    -- an outcome that did not happen.
    PERFORM zeroth._raise_unlisted_edge(
        CASE WHEN _leave_for_wait.wait_reason LIKE 'event:%' THEN 'wait_for_event' ELSE 'wait_for_children' END,
        _leave_for_wait.run_id, v_end.from_status, v_end.sqlstate);
    RETURN v_end.to_status;
END
$$;
COMMENT ON FUNCTION zeroth._leave_for_wait(text, text, uuid, text, bigint, text, timestamptz) IS 'Internal: the holder''s running run → waiting (wait_reason) or, with a pending cancel request, cancelled, by the settle path (zeroth._settle_one, kind wait); lease, slot and attempt given back, fenced; NOTIFY zeroth_wakeup when a slot was freed. Returns the new status, NULL when fenced out.';
ALTER FUNCTION zeroth._leave_for_wait(text, text, uuid, text, bigint, text, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._leave_for_wait(text, text, uuid, text, bigint, text, timestamptz) FROM PUBLIC;
-- ZP008 unless (tenant, workspace key, run, step key) fits the primary keys of run_steps and
-- event_waits: PostgreSQL refuses an index row over 2704 bytes (54000). Each part is bounded in
-- characters, not bytes: a tenant, a workspace and a step key of four-byte characters at those
-- limits make 3,200 bytes, which no call could ever record (54000 from record_step). Checked before
-- anything runs, so run.step fails before its function's side effect, never after. Same bound as
-- zeroth._key_fits (2600 bytes leave room for the uuid and the tuple and varlena headers).
CREATE OR REPLACE FUNCTION zeroth._require_step_key_fits(tenant_id text, workspace_key text,
                                                         step_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(octet_length(tenant_id), 0) + coalesce(octet_length(workspace_key), 0)
       + octet_length(step_key) > 2600 THEN
        RAISE EXCEPTION 'step_key is too long for this scope: tenant, workspace and step key '
                        'together may hold at most 2600 bytes, got %',
            coalesce(octet_length(tenant_id), 0) + coalesce(octet_length(workspace_key), 0)
            + octet_length(step_key)
            USING ERRCODE = 'ZP008';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._require_step_key_fits(text, text, text) IS 'Internal: ZP008 unless tenant, workspace key and step key together hold at most 2600 bytes (the run_steps and event_waits primary keys refuse index rows over 2704).';
ALTER FUNCTION zeroth._require_step_key_fits(text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._require_step_key_fits(text, text, text) FROM PUBLIC;
