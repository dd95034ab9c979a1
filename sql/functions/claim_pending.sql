-- claim_pending: lease up to batch_size pending runs (status stays pending until start_run).
-- Order: priority DESC, run_after, created_at, read from the session's claim floor (a run
-- below it waits at most its bound, ≤ 60 s: sql/README.md, "Claim order and the claim floor");
-- only runs whose run_after has passed and that hold no live lease. With max_concurrency, free admission slots are taken first with SKIP LOCKED (no
-- claimer waits on another); none free → one row with run_id NULL and concurrency_saturated.
-- The scope's zeroth.scope_limits row applies: its max_concurrency replaces the argument; paused
-- leases nothing (one run_id-NULL row, not saturated). A run whose last claim lapsed before
-- start_run counts that attempt when re-leased; with none left it is dead-lettered instead
-- (attempts_exhausted) and the claim takes the next run.
-- Locks: slot rows, then run rows, all FOR UPDATE SKIP LOCKED. Bumps lease_generation per claim.
-- Raises ZP006 (max_concurrency in an impossible scope), ZP008. Notifies zeroth_wakeup only for
-- a run it dead-lettered. Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): the calling worker's code version (NULL: unversioned): a run not
-- yet started records it; a started run is claimed only when the deployment's version_policy lets
-- this version resume it (zeroth._version_serves; any, the default, claims every run).
CREATE OR REPLACE FUNCTION zeroth.claim_pending(
    deployment_ref  text,
    worker_id       text,
    tenant_id       text             DEFAULT NULL,
    workspace_id    text             DEFAULT NULL,
    max_concurrency integer          DEFAULT NULL,
    batch_size      integer          DEFAULT 1,
    lease_seconds   double precision DEFAULT NULL,
    code_version    text             DEFAULT NULL)
    RETURNS SETOF zeroth.claimed_run
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- PL/pgSQL, not SQL: a SECURITY DEFINER SQL function is never inlined, and before PostgreSQL
    -- 18 its body is parsed and planned again at every call (~55 µs of every claim on
    -- PostgreSQL 15; issue 30); PL/pgSQL keeps its plan for the session.
    RETURN QUERY
    SELECT * FROM zeroth._claim_pending(claim_pending.deployment_ref, claim_pending.worker_id, claim_pending.tenant_id,
                                        claim_pending.workspace_id, claim_pending.max_concurrency, claim_pending.batch_size,
                                        claim_pending.lease_seconds, false, claim_pending.code_version);
END
$$;
COMMENT ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, text) IS
'claim_pending: lease up to batch_size pending runs (status stays pending; start_run makes it running). Order: priority DESC, run_after, created_at, from the session''s claim floor (a run below it is claimed by that session within the floor''s bound, at most 60 s; sql/README.md). With max_concurrency, takes free admission slots with SKIP LOCKED (claimers never queue on one row); a single run_id-NULL row reports saturation or an empty queue. The scope''s zeroth.scope_limits row applies: its max_concurrency replaces the argument, paused leases nothing. A claim that lapsed before start_run counts its attempt when the run is claimed again; with no attempt left the run is dead-lettered instead (stop_reason attempts_exhausted) and the claim takes the next one. Bumps lease_generation. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): the version of the calling worker''s code (NULL: unversioned; ZP008 unless 1 to 128 characters, a letter or digit then letters, digits and . _ - + : /): a run not yet started records it; a started run is claimed only when the deployment''s version_policy lets this version resume it (zeroth.deployments: any, the default, claims every run). Raises ZP006, ZP008. Notifies zeroth_wakeup (only for a run it dead-lettered). Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_pending(text, text, text, text, integer, integer, double precision, text) TO zeroth_worker;
