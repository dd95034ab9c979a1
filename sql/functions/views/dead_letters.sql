-- sql/functions/views/dead_letters.sql: the operator view zeroth.dead_letters. Re-applied by every
-- upgrade (sql/README.md).
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policy on zeroth.runs filters it to one tenant.
CREATE OR REPLACE VIEW zeroth.dead_letters WITH (security_invoker = true) AS
SELECT r.run_id,
       r.tenant_id,
       r.workspace_id,
       r.deployment_ref,
       r.attempts,
       r.max_attempts,
       r.error,
       r.dead_lettered_at,
       r.created_at,
       r.payload
  FROM zeroth.runs r
 WHERE r.dead_lettered_at IS NOT NULL;
COMMENT ON VIEW zeroth.dead_letters IS 'Runs that failed max_attempts times with a retryable error and were dead-lettered by fail_run; redrive_run puts one back to pending.';
ALTER VIEW zeroth.dead_letters OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.dead_letters FROM PUBLIC;
GRANT SELECT ON zeroth.dead_letters TO zeroth_reader;
