-- sql/functions/views/scope_overview.sql: the operator view zeroth.scope_overview. Re-applied
-- by every upgrade (sql/README.md).
-- One row per (tenant, workspace, deployment) that has pending, running, waiting or failed runs,
-- leases, dead letters or a zeroth.scope_limits row: the dashboard's overview table (issue 17), out of
-- the other operator views (each found through its partial index, so the view costs O(active
-- runs + dead letters), not O(all runs)) and the running runs (runs_running_idx).
-- security_invoker: the view reads as its caller, so zeroth_reader's row-level security
-- policies on zeroth.runs and zeroth.scope_limits filter it to one tenant.
CREATE OR REPLACE VIEW zeroth.scope_overview WITH (security_invoker = true) AS
SELECT s.tenant_id,
       s.workspace_id,
       s.deployment_ref,
       sum(s.pending)::bigint AS pending,
       sum(s.due)::bigint AS due,
       sum(s.scheduled)::bigint AS scheduled,
       sum(s.running)::bigint AS running,
       sum(s.live_leases)::bigint AS live_leases,
       sum(s.expired_leases)::bigint AS expired_leases,
       sum(s.dead_letters)::bigint AS dead_letters,
       min(s.oldest_due_at) AS oldest_due_at,
       coalesce(bool_or(s.paused), false) AS paused,
       max(s.max_concurrency) AS max_concurrency,
       sum(s.waiting)::bigint AS waiting,
       sum(s.failed)::bigint AS failed
  FROM (SELECT q.tenant_id, q.workspace_id, q.deployment_ref, q.pending, q.due, q.scheduled,
               0 AS running, 0 AS live_leases, 0 AS expired_leases, 0 AS dead_letters,
               q.oldest_due_at, NULL::boolean AS paused, NULL::integer AS max_concurrency,
               0 AS waiting, 0 AS failed
          FROM zeroth.queue_depth q
        UNION ALL
        SELECT r.tenant_id, r.workspace_id, r.deployment_ref, 0, 0, 0, count(*), 0, 0, 0,
               NULL, NULL, NULL, 0, 0
          FROM zeroth.runs r
         WHERE r.status = 'running'
         GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref
        UNION ALL
        SELECT l.tenant_id, l.workspace_id, l.deployment_ref, 0, 0, 0, 0, count(*), 0, 0,
               NULL, NULL, NULL, 0, 0
          FROM zeroth.live_leases l
         GROUP BY l.tenant_id, l.workspace_id, l.deployment_ref
        UNION ALL
        SELECT e.tenant_id, e.workspace_id, e.deployment_ref, 0, 0, 0, 0, 0, count(*), 0,
               NULL, NULL, NULL, 0, 0
          FROM zeroth.expired_leases e
         GROUP BY e.tenant_id, e.workspace_id, e.deployment_ref
        UNION ALL
        SELECT d.tenant_id, d.workspace_id, d.deployment_ref, 0, 0, 0, 0, 0, 0, count(*),
               NULL, NULL, NULL, 0, 0
          FROM zeroth.dead_letters d
         GROUP BY d.tenant_id, d.workspace_id, d.deployment_ref
        UNION ALL
        SELECT k.tenant_id, k.workspace_id, k.deployment_ref, 0, 0, 0, 0, 0, 0, 0,
               NULL, k.paused, k.max_concurrency, 0, 0
          FROM zeroth.scope_limits k
        UNION ALL
        -- Waiting for an event, for children or for a thread's turn (runs_waiting_idx).
        SELECT r.tenant_id, r.workspace_id, r.deployment_ref, 0, 0, 0, 0, 0, 0, 0,
               NULL, NULL, NULL, count(*), 0
          FROM zeroth.runs r
         WHERE r.status = 'waiting'
         GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref
        UNION ALL
        -- Failed without a dead letter: NonRetryableError, a refused payload, a failed child
        -- (runs_failed_idx); the dead letters are counted above.
        SELECT r.tenant_id, r.workspace_id, r.deployment_ref, 0, 0, 0, 0, 0, 0, 0,
               NULL, NULL, NULL, 0, count(*)
          FROM zeroth.runs r
         WHERE r.status = 'failed' AND r.dead_lettered_at IS NULL
         GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref
       ) s
 GROUP BY s.tenant_id, s.workspace_id, s.deployment_ref;
COMMENT ON VIEW zeroth.scope_overview IS 'Per (tenant, workspace, deployment): pending runs, the due ones nobody holds, scheduled, running, live and expired leases, dead letters, oldest_due_at (from queue_depth: how long due work has waited), the scope''s paused flag and max_concurrency (from zeroth.scope_limits; false / NULL without a row), waiting runs (an event, children, a thread''s turn) and failed runs that are not dead letters (a non-retryable failure, a refused payload). A scope appears while it has any of these or a limits row. Each part is found through its partial index (pending, running, waiting, failed, dead letters), so the view costs O(unfinished runs + failures), not O(all runs).';
ALTER VIEW zeroth.scope_overview OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.scope_overview FROM PUBLIC;
GRANT SELECT ON zeroth.scope_overview TO zeroth_reader;
