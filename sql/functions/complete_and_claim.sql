-- complete_and_claim: complete_runs, then claim_and_start into the slots it freed, in one call
-- and one transaction: a worker that finishes a run and has more work pays one commit (one WAL
-- flush) per run instead of two, and one round trip. The completions are exactly complete_runs'
-- (each fenced on its own; refused ones come back false); the claim is exactly claim_and_start's
-- for deployment_ref in the same scope (batch_size ≥ 1; a slot freed by the completions is
-- claimable by it). Locks: complete_runs' (slots, then runs, in run_id order, lock_timeout 2 s),
-- then the claim's SKIP LOCKED. One row per claim row (claimed_run columns, the saturation row
-- when nothing was claimed), each carrying `completed`: one boolean per requested run, in input
-- order. Raises ZP006, ZP008, 55P03 (then nothing is written). Notifies zeroth_wakeup as
-- complete_runs.
-- Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): the claim's, as claim_and_start's.
CREATE OR REPLACE FUNCTION zeroth.complete_and_claim(
    deployment_ref  text,
    worker_id       text,
    run_ids         uuid[],
    generations     bigint[],
    outputs         jsonb[]          DEFAULT NULL,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT NULL,
    code_version    text             DEFAULT NULL)
    RETURNS TABLE (completed boolean[], claimed zeroth.claimed_run)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_completed boolean[];
BEGIN
    -- Any error (a bad claim argument, a value the completions cannot store, 55P03) ends the
    -- whole call: the completions and the claim are one statement's work, never half of it.
    SELECT coalesce(array_agg(c.completed ORDER BY c.position), '{}') INTO v_completed
      FROM zeroth.complete_runs(worker_id => complete_and_claim.worker_id,
                                run_ids => complete_and_claim.run_ids,
                                generations => complete_and_claim.generations,
                                outputs => complete_and_claim.outputs,
                                tenant_id => complete_and_claim.tenant_id,
                                workspace_id => complete_and_claim.workspace_id)
           WITH ORDINALITY AS c(run_id, completed, position);
    RETURN QUERY
    SELECT v_completed, c
      FROM zeroth._claim_pending(complete_and_claim.deployment_ref, complete_and_claim.worker_id,
                                 complete_and_claim.tenant_id, complete_and_claim.workspace_id,
                                 complete_and_claim.max_concurrency, complete_and_claim.batch_size,
                                 complete_and_claim.lease_seconds, true,
                                 complete_and_claim.code_version) AS c;
END
$$;
COMMENT ON FUNCTION zeroth.complete_and_claim(text, text, uuid[], bigint[], jsonb[], text, text, integer, integer, double precision, text) IS
'complete_and_claim: complete_runs, then claim_and_start for deployment_ref in the same scope, in one transaction (one commit per finished run instead of two). Completions exactly as complete_runs (each fenced on its own); the claim exactly as claim_and_start (batch_size >= 1; the slots the completions freed are claimable by it). Rows: one per claim row (claimed, the claimed_run; the saturation row when nothing was claimed), each with completed: one boolean per requested run, in input order. Locks as complete_runs, then SKIP LOCKED. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): the claim''s, as claim_and_start''s. Raises ZP006, ZP008, 55P03 (nothing written). Notifies zeroth_wakeup as complete_runs does (slots freed). Time: clock_timestamp().';
ALTER FUNCTION zeroth.complete_and_claim(text, text, uuid[], bigint[], jsonb[], text, text, integer, integer, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.complete_and_claim(text, text, uuid[], bigint[], jsonb[], text, text, integer, integer, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.complete_and_claim(text, text, uuid[], bigint[], jsonb[], text, text, integer, integer, double precision, text) TO zeroth_worker;
