-- sql/functions/internal/timeouts.sql: the end of a run whose attempt or run deadline passed while
-- nobody held a live lease on it (issue 34 item 2), for the orphan sweep (claim_orphaned,
-- claim_orphaned_scopes). Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they
-- run inside the SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Ends one running run whose lease lapsed at its attempt deadline (the claims and renewals cap a
-- lease there, so lease_expires_at >= attempt_deadline_at says the attempt ran out of time, not
-- that its worker died first) or whose run deadline passed (run_deadline_at <= at, however its
-- lease lapsed). Never waits: the admission slot naming (run, generation) and then the run row are
-- taken FOR UPDATE SKIP LOCKED, the run re-checked under its lock (still running, same holder and
-- generation, lease lapsed, past a deadline), so a renewal or settle that holds the row now goes
-- first and this call returns false (a renewal that comes after finds the lease expired, or the
-- generation ended). Then it settles through the one settle path (zeroth._settle) on behalf of
-- the lapsed holder as of the moment its lease lapsed (at => lease_expires_at, the fence's own
-- terms: holder, generation, lease live at that instant): kind timeout (retried by the
-- deployment's retry policy, or dead-lettered with no attempt left; stop_reason attempt_timeout)
-- or run_timeout (failed for good; stop_reason run_timeout). The attempt counted at its claim
-- stays counted; the ended attempt is written to zeroth.run_attempts (outcome timed_out).
-- Returns whether it ended the run.
CREATE OR REPLACE FUNCTION zeroth._end_timed_out(tenant_id text, workspace_key text, run_id uuid,
                                                 at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_holder text;
    v_gen    bigint;
    v_slot   integer;
    v_run    record;
    v_slots  tid[];
    v_out   record;
BEGIN
    SELECT r.lease_worker_id, r.lease_generation, r.admission_slot INTO v_holder, v_gen, v_slot
      FROM zeroth.runs r
     WHERE r.tenant_id = _end_timed_out.tenant_id AND r.workspace_key = _end_timed_out.workspace_key
       AND r.run_id = _end_timed_out.run_id AND r.status = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT coalesce(array_agg(s.ctid), '{}') INTO v_slots
      FROM (SELECT s.ctid FROM zeroth.admission_slots s
             WHERE s.run_id = _end_timed_out.run_id AND s.lease_generation = v_gen
               AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM
                   (_end_timed_out.tenant_id, _end_timed_out.workspace_key)
               FOR UPDATE OF s SKIP LOCKED) s;
    IF v_slot IS NOT NULL AND cardinality(v_slots) = 0 THEN
        RETURN false;  -- its slot is held by someone right now: the next pass
    END IF;
    SELECT r.ctid, r.lease_expires_at,
           CASE WHEN r.run_deadline_at <= _end_timed_out.at THEN 'run_timeout' ELSE 'timeout' END AS kind
      INTO v_run
      FROM zeroth.runs r
     WHERE r.tenant_id = _end_timed_out.tenant_id AND r.workspace_key = _end_timed_out.workspace_key
       AND r.run_id = _end_timed_out.run_id
       AND r.status = 'running'
       AND r.lease_worker_id = v_holder
       AND r.lease_generation = v_gen
       AND r.lease_expires_at < _end_timed_out.at
       AND (r.lease_expires_at >= r.attempt_deadline_at OR r.run_deadline_at <= _end_timed_out.at)
       FOR UPDATE OF r SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT s.outcome INTO v_out
      FROM zeroth._settle(_end_timed_out.tenant_id, _end_timed_out.workspace_key,
                          v_holder, ARRAY[_end_timed_out.run_id], ARRAY[v_gen],
                          ARRAY[v_run.kind], ARRAY[NULL::jsonb], ARRAY[NULL::timestamptz], ARRAY[NULL::text],
                          NULL, NULL, ARRAY[v_run.ctid], v_slots, v_run.lease_expires_at) s;
    RETURN v_out.outcome IS NOT NULL;
END
$$;
COMMENT ON FUNCTION zeroth._end_timed_out(text, text, uuid, timestamptz) IS 'Internal: the orphan sweep''s end of a running run whose lease lapsed at its attempt deadline, or whose run deadline passed: slot and run locked SKIP LOCKED and re-checked, then settled by zeroth._settle on behalf of the lapsed holder as of its lease''s lapse: timeout (retried / dead-lettered by the retry policy, stop_reason attempt_timeout) or run_timeout (failed, stop_reason run_timeout). True when it ended the run.';
ALTER FUNCTION zeroth._end_timed_out(text, text, uuid, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._end_timed_out(text, text, uuid, timestamptz) FROM PUBLIC;
