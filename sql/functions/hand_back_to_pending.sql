-- hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation)
-- (graceful shutdown, contention). The live holder stops the attempt and returns the run to the
-- queue itself, so the attempt is given back — for the first max_attempts hand-backs (hand_backs
-- counts them). After that the attempt stays counted, and a hand-back that finds every attempt
-- used dead-letters the run instead (failed, stop_reason attempts_exhausted): a handler that
-- always outlives the shutdown, or sends its own worker SIGTERM, cannot loop for ever. Still
-- returns true then (the lease was given back). An admin cancel that got there first wins: the run is no
-- longer running, so nothing matches; an expired or cleared lease matches nothing either. Clears
-- the lease and recovery id, frees the slot. Locks: slot, then run. Returns false on no match.
-- Raises ZP003 (the caller's live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.hand_back_to_pending(
    run_id       uuid,
    worker_id    text,
    generation   bigint,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_tenant text := zeroth._scope_tenant(hand_back_to_pending.tenant_id, hand_back_to_pending.workspace_id);
    v_wskey  text := zeroth._workspace_key(hand_back_to_pending.workspace_id);
    v_end    record;
BEGIN
    -- The settle path (sql/functions/internal/settle.sql): checks, lock, clock, settle. The
    -- first max_attempts hand-backs give the attempt back; after that the attempt stays counted,
    -- and a hand-back that finds no attempt left dead-letters the run.
    v_end := zeroth._settle_one(v_tenant, v_wskey, hand_back_to_pending.run_id, hand_back_to_pending.worker_id,
                                hand_back_to_pending.generation, 'hand_back');
    -- The caller's live lease on a running run whose edge is not listed (a DBA removed it):
    -- refused out loud, never reported as a lost lease. A claim not started: false, as ever.
    IF v_end.from_status = 'running' THEN
        PERFORM zeroth._raise_unlisted_edge('hand_back_to_pending', hand_back_to_pending.run_id, v_end.from_status, v_end.sqlstate);
    END IF;
    RETURN v_end.sqlstate IS NULL;
END
$$;
COMMENT ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) IS
'hand_back_to_pending: running → pending for exactly the live lease (worker_id, generation); gives the attempt back for the first max_attempts hand-backs (runs.hand_backs), after that keeps it counted and, when no attempt is left, dead-letters the run instead (failed, stop_reason attempts_exhausted; still returns true); clears the lease, frees the slot. An admin cancel that came first wins (no match); an expired or cleared lease matches nothing. Returns false on no match. Raises ZP003 (the caller''s live lease but the edge is not listed in zeroth.run_transitions), ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.hand_back_to_pending(uuid, text, bigint, text, text) TO zeroth_worker;
