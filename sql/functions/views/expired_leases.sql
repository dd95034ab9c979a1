-- sql/functions/views/expired_leases.sql: the operator view zeroth.expired_leases. Re-applied by every
-- upgrade (sql/README.md).
-- Expired leases that nobody took over yet. A running one is an orphan that claim_orphaned will
-- recover (from recovery_checkpoint_id = its latest checkpoint); a pending one is a claim that was
-- never started and that claim_pending will simply take again.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.expired_leases WITH (security_invoker = true) AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.status,
       r.lease_worker_id,
       r.lease_generation,
       r.lease_expires_at,
       EXTRACT(epoch FROM clock_timestamp() - r.lease_expires_at)::double precision AS seconds_expired,
       CASE WHEN r.status = 'running' THEN 'claim_orphaned' ELSE 'claim_pending' END AS reclaimed_by,
       r.checkpoint_seq
  FROM zeroth.runs r
 WHERE (r.status = 'pending' OR r.status = 'running')
   AND r.lease_expires_at < clock_timestamp();
COMMENT ON VIEW zeroth.expired_leases IS 'Pending or running runs whose lease expired and that no worker has taken yet. reclaimed_by names the claim that will take each: claim_orphaned for running runs (orphans of a crashed or stalled worker, resumed from their latest checkpoint; checkpoint_seq counts them), claim_pending for claims that were never started.';
ALTER VIEW zeroth.expired_leases OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.expired_leases FROM PUBLIC;
GRANT SELECT ON zeroth.expired_leases TO zeroth_reader;
