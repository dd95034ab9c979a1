-- sql/functions/views/live_leases.sql: the operator view zeroth.live_leases. Re-applied by every
-- upgrade (sql/README.md).
-- Live leases: every pending (claimed) or running run whose lease has not expired. The pending
-- and running rows are found through the partial indexes of 0001, so the view costs O(active
-- runs) whatever the number of finished runs.
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.live_leases WITH (security_invoker = true) AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.status,
       r.lease_worker_id,
       r.lease_generation,
       r.lease_acquired_at,
       r.lease_expires_at,
       EXTRACT(epoch FROM r.lease_expires_at - clock_timestamp())::double precision AS seconds_left,
       r.cancel_requested_at
  FROM zeroth.runs r
 WHERE (r.status = 'pending' OR r.status = 'running')
   AND r.lease_expires_at >= clock_timestamp();
COMMENT ON VIEW zeroth.live_leases IS 'Runs holding a live lease: claimed (status pending, not yet started) or running. seconds_left is measured on the database clock; cancel_requested_at is set when request_cancel asked the holder to stop.';
ALTER VIEW zeroth.live_leases OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.live_leases FROM PUBLIC;
GRANT SELECT ON zeroth.live_leases TO zeroth_reader;
