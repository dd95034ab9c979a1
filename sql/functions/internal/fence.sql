-- sql/functions/internal/fence.sql: the fence of every lease-holder write: lock the leased run, then explain a miss.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Raises ZP003 invalid_transition when the caller still holds a live lease but the run's status
-- does not allow the edge; returns quietly when the caller was simply fenced out. Called only after
-- a fenced UPDATE matched nothing, so the routine path pays no extra read.
CREATE OR REPLACE FUNCTION zeroth._explain_fenced_miss(
    tenant_id text, workspace_key text, run_id uuid, worker_id text, generation bigint, at timestamptz,
    transition text, allowed zeroth.run_status[])
    RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status
      FROM zeroth.runs r
     WHERE r.tenant_id = _explain_fenced_miss.tenant_id
       AND r.workspace_key = _explain_fenced_miss.workspace_key
       AND r.run_id = _explain_fenced_miss.run_id
       AND r.lease_worker_id = _explain_fenced_miss.worker_id
       AND r.lease_generation = _explain_fenced_miss.generation
       AND r.lease_expires_at >= _explain_fenced_miss.at;
    IF FOUND AND NOT v_status = ANY (allowed) THEN
        RAISE EXCEPTION '% needs a run in status %, run % is %', transition, allowed, run_id, v_status
            USING ERRCODE = 'ZP003';
    END IF;
END
$$;
COMMENT ON FUNCTION zeroth._explain_fenced_miss(text, text, uuid, text, bigint, timestamptz, text, zeroth.run_status[]) IS 'Internal: after a fenced UPDATE matched nothing, raise ZP003 if the lease is still held (wrong status) rather than fenced out.';
ALTER FUNCTION zeroth._explain_fenced_miss(text, text, uuid, text, bigint, timestamptz, text, zeroth.run_status[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._explain_fenced_miss(text, text, uuid, text, bigint, timestamptz, text, zeroth.run_status[]) FROM PUBLIC;

-- Locks the run row a fenced write names when the lease it names is the caller's (worker id,
-- generation, not yet expired) and returns the run's status, NULL when the lease is not the
-- caller's. Every fenced write reads the clock only after this lock: a write that waited
-- for the row (behind a cancel request, an operator's clear_lease, another call of the same
-- worker) decides with the time it got the row, so a lease that expired or was cleared while it
-- waited is refused. The clock read at the start of the call would have let it land. By primary
-- key, and the status is returned, not filtered: a predicate on the status let a generic plan
-- reach the run through runs_running_idx and walk every running run of the scope.
CREATE OR REPLACE FUNCTION zeroth._lock_leased_run(tenant_id text, workspace_key text, run_id uuid,
                                        worker_id text, generation bigint)
    RETURNS zeroth.run_status
    -- (PL/pgSQL for the reason zeroth._notify gives: every fenced single-run call locks here.)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_status zeroth.run_status;
BEGIN
    SELECT r.status INTO v_status FROM zeroth.runs r
     WHERE r.tenant_id = _lock_leased_run.tenant_id
       AND r.workspace_key = _lock_leased_run.workspace_key
       AND r.run_id = _lock_leased_run.run_id
       AND r.lease_worker_id = _lock_leased_run.worker_id
       AND r.lease_generation = _lock_leased_run.generation
       -- Already expired: refused without waiting for whoever holds the row.
       AND r.lease_expires_at >= zeroth._now()
       FOR UPDATE;
    RETURN v_status;
END
$$;
COMMENT ON FUNCTION zeroth._lock_leased_run(text, text, uuid, text, bigint) IS 'Internal: lock the run row a fenced write names when its lease is (worker_id, generation) and not expired; return its status (NULL: not that lease). Callers read the clock after it.';
ALTER FUNCTION zeroth._lock_leased_run(text, text, uuid, text, bigint) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._lock_leased_run(text, text, uuid, text, bigint) FROM PUBLIC;
