-- reconcile_thread_runs: the periodic pass over active thread runs of a scope (one deployment or
-- all) whose owners' leases expired more than grace ago; each is taken over as claim_for_takeover
-- does (its resumable choice decides). Concurrent reconcilers never block each other and report
-- each run once (SKIP LOCKED). A run whose takeover raises is rolled back alone and dead-lettered
-- (stop_reason recovery_failed). Returns the runs taken over. Raises ZP006, ZP008. Notifies
-- zeroth_wakeup. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.reconcile_thread_runs(
    deployment_ref text             DEFAULT NULL,
    tenant_id      text             DEFAULT NULL,
    workspace_id   text             DEFAULT NULL,
    grace_seconds  double precision DEFAULT 10,
    claim_limit    integer          DEFAULT 100,
    stop_reason    text             DEFAULT 'orphan_recovered',
    message        text             DEFAULT NULL)
    RETURNS SETOF zeroth.takeover
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_grace  interval := zeroth._grace_interval(reconcile_thread_runs.grace_seconds);
    v_tenant text := zeroth._scope_tenant(reconcile_thread_runs.tenant_id, reconcile_thread_runs.workspace_id);
    v_wskey  text := zeroth._workspace_key(reconcile_thread_runs.workspace_id);
    v_id     uuid;
    v_ids    uuid[];
    v_rows   zeroth.takeover[];
BEGIN
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require(reconcile_thread_runs.claim_limit BETWEEN 1 AND 1000, 'claim_limit must be between 1 and 1000');
    PERFORM zeroth._require_identifier(reconcile_thread_runs.stop_reason, 'stop_reason');
    -- The candidates are planned on every call, on the table as it is (EXECUTE: a one-shot plan;
    -- the text is constant, the values are parameters). The scan has no key to name, and on a
    -- small table runs_thread_idx (every run of every thread, history included) costs the same as
    -- runs_thread_active_idx: a generic plan cached then walked the threads' whole history on
    -- every pass. A periodic pass can afford the planning; _take_over keeps its cached plans.
    v_ids := ARRAY[]::uuid[];
    FOR v_id IN EXECUTE $sql$
        SELECT r.run_id FROM zeroth.runs r
         WHERE r.tenant_id = $1 AND r.workspace_key = $2
           AND r.thread_id IS NOT NULL AND r.status IN ('pending', 'running', 'waiting')
           AND r.thread_queued_at IS NULL
           AND ($3::text IS NULL OR r.deployment_ref = $3::text)
           AND r.lease_expires_at + $4::interval < $5::timestamptz
         ORDER BY r.lease_expires_at
         LIMIT $6::integer $sql$
        USING v_tenant, v_wskey, reconcile_thread_runs.deployment_ref, v_grace, v_now,
              reconcile_thread_runs.claim_limit
    LOOP
        v_ids := v_ids || v_id;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- All in one subtransaction; if one takeover raises, again one run per
    -- subtransaction, so that run is ended alone (zeroth._end_unrecoverable: dead-lettered,
    -- stop_reason recovery_failed) and the others are taken over.
    BEGIN
        v_rows := '{}';
        FOREACH v_id IN ARRAY v_ids LOOP
            v_rows := v_rows || ARRAY(SELECT t FROM zeroth._take_over(
                v_tenant, v_wskey, v_id, v_grace, v_now, reconcile_thread_runs.stop_reason,
                reconcile_thread_runs.message) AS t);
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        IF zeroth._transient_sqlstate(SQLSTATE) AND NOT zeroth._lock_timed_out(SQLSTATE) THEN
            RAISE;
        END IF;
        v_rows := '{}';
        FOREACH v_id IN ARRAY v_ids LOOP
            v_rows := v_rows || ARRAY(SELECT t FROM zeroth._take_over_isolated(
                v_tenant, v_wskey, v_id, v_grace, v_now, reconcile_thread_runs.stop_reason,
                reconcile_thread_runs.message) AS t);
        END LOOP;
    END;
    RETURN QUERY SELECT * FROM unnest(v_rows);
END
$$;
COMMENT ON FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text) IS
'reconcile_thread_runs: take over (as claim_for_takeover) up to claim_limit active thread runs of a scope (one deployment or all) whose owners'' leases expired more than grace ago. Concurrent reconcilers never block each other or report a run twice. A run whose takeover raises is rolled back alone and dead-lettered (stop_reason recovery_failed, outcome dead_lettered). Runs under lock_timeout 2 s: a run whose recovery waits longer for a lock (a row someone holds in an open transaction) is left as it was, with a WARNING, for the next pass, and the others are recovered. Raises ZP006, ZP008. Notifies zeroth_wakeup. Time: clock_timestamp().';
ALTER FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.reconcile_thread_runs(text, text, text, double precision, integer, text, text) TO zeroth_worker;
