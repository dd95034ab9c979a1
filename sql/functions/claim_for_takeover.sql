-- claim_for_takeover: take over one run whose owner's lease expired more than grace ago, applying
-- the run's own choice: resumable → requeued (back to pending, claimable, checkpoints kept; the
-- interrupted attempt stays counted; a claim that lapsed before start_run counts its attempt
-- here) or, out of attempts, dead-lettered (a lapsed unstarted claim with none left: whatever
-- resumable says); not resumable → failed
-- with {stop_reason, message}; a cancel was requested → cancelled. Returns the row once, or
-- nothing (lease live or within grace, renewing right now, not active, unknown). Locks: slot then
-- run, SKIP LOCKED. A takeover that raises is rolled back and the run dead-lettered (stop_reason
-- recovery_failed, outcome dead_lettered). Raises ZP008. Notifies zeroth_wakeup (and
-- zeroth_run_finished for thread runs). Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.claim_for_takeover(
    run_id        uuid,
    tenant_id     text             DEFAULT NULL,
    workspace_id  text             DEFAULT NULL,
    grace_seconds double precision DEFAULT 10,
    stop_reason   text             DEFAULT 'orphan_recovered',
    message       text             DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now   timestamptz := zeroth._now();
    v_grace interval := zeroth._grace_interval(claim_for_takeover.grace_seconds);
BEGIN
    PERFORM zeroth._require(claim_for_takeover.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(claim_for_takeover.stop_reason, 'stop_reason');
    RETURN QUERY SELECT * FROM zeroth._take_over_isolated(
        zeroth._scope_tenant(claim_for_takeover.tenant_id, claim_for_takeover.workspace_id),
        zeroth._workspace_key(claim_for_takeover.workspace_id), claim_for_takeover.run_id, v_grace, v_now,
        claim_for_takeover.stop_reason, claim_for_takeover.message);
END
$$;
COMMENT ON FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text) IS
'claim_for_takeover: take over one run whose owner''s lease expired more than grace ago: resumable → requeued (pending, the interrupted attempt stays counted; a claim that lapsed before start_run counts its attempt) or dead_lettered when out of attempts (a lapsed unstarted claim with none left is dead-lettered whatever resumable says), not resumable → failed with {stop_reason, message}, cancel requested → cancelled. Returns the row once, or nothing (live, within grace, being renewed, not active, unknown). A takeover that raises is rolled back and the run dead-lettered instead (stop_reason recovery_failed). SKIP LOCKED; runs under lock_timeout 2 s: a takeover that waits longer for a lock (a row someone holds in an open transaction) returns nothing, with a WARNING. Raises ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_for_takeover(uuid, text, text, double precision, text, text) TO zeroth_worker;
