-- claim_and_start: claim_pending, and every claimed run is running when the call returns —
-- attempts counted and started_at set, in the claiming UPDATE (no start_run round trip). Same
-- order, arguments, saturation row, zeroth.scope_limits rules and locks as claim_pending, and
-- like it counts a lapsed unstarted claim (none left: dead-lettered, the next run claimed).
-- Raises ZP006, ZP008. Notifies zeroth_wakeup only for a run it dead-lettered.
-- Time: clock_timestamp().
-- lease_seconds NULL (default): the deployment's registered lease (zeroth.deployments; a DBA's, or
-- this login's own registration: zeroth._policy_binds_caller), else 60 s.
-- code_version (issue 34, item 3): the calling worker's code version (NULL: unversioned): a run not
-- yet started records it; a started run is claimed only when the deployment's version_policy lets
-- this version resume it (zeroth._version_serves; any, the default, claims every run).
CREATE OR REPLACE FUNCTION zeroth.claim_and_start(
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
    SELECT * FROM zeroth._claim_pending(claim_and_start.deployment_ref, claim_and_start.worker_id, claim_and_start.tenant_id,
                                        claim_and_start.workspace_id, claim_and_start.max_concurrency, claim_and_start.batch_size,
                                        claim_and_start.lease_seconds, true, claim_and_start.code_version);
END
$$;
COMMENT ON FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, text) IS
'claim_and_start: claim_pending and start_run in one call — up to batch_size pending runs are leased (new generation) and made running (attempt counted, started_at set) by one UPDATE. Same order, max_concurrency slots, zeroth.scope_limits rules (its max_concurrency replaces the argument; paused leases nothing), saturation row and SKIP LOCKED locking as claim_pending; like it, counts the attempt of a claim that lapsed before start_run, and dead-letters a run with none left (attempts_exhausted) instead of claiming it. lease_seconds NULL (the default): the deployment''s registered lease (zeroth.deployments.lease_seconds: a DBA''s, or this login''s own registration), else 60 s. code_version (issue 34): the version of the calling worker''s code (NULL: unversioned; ZP008 unless 1 to 128 characters, a letter or digit then letters, digits and . _ - + : /): a run not yet started records it; a started run is claimed only when the deployment''s version_policy lets this version resume it (zeroth.deployments: any, the default, claims every run). Raises ZP006, ZP008. Notifies zeroth_wakeup (only for a run it dead-lettered). Time: clock_timestamp().';
ALTER FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.claim_and_start(text, text, text, text, integer, integer, double precision, text) TO zeroth_worker;
