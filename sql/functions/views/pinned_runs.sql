-- sql/functions/views/pinned_runs.sql: the operator view zeroth.pinned_runs (issue 34, item 3).
-- Re-applied by every upgrade (sql/README.md). security_invoker: zeroth_reader's row-level
-- security on zeroth.runs filters it to one tenant.
-- The active runs that recorded a code version, per (tenant, workspace, deployment, version), in
-- the deployments whose version_policy is not any: only a worker of a version allowed to resume
-- them may claim them once they started. waiting_for_version counts the due pending ones nobody
-- holds (and the running ones whose lease expired): work that a worker of that version (or of a
-- compatible one) must take. When no such worker runs any more, zeroth.retire_code_version moves
-- them to another version or fails them (docs/dba-guide.md, "Deploying a new code version").
CREATE OR REPLACE VIEW zeroth.pinned_runs WITH (security_invoker = true) AS
SELECT p.tenant_id,
       p.workspace_id,
       p.deployment_ref,
       (SELECT v.code_version FROM zeroth.code_versions v
         WHERE v.version_id = p.code_version_id LIMIT 1) AS code_version,
       p.version_policy,
       p.pending,
       p.running,
       p.waiting,
       p.waiting_for_version,
       p.oldest_pending_at
  FROM (SELECT r.tenant_id, r.workspace_id, r.deployment_ref, r.code_version_id, d.version_policy,
               count(*) FILTER (WHERE r.status = 'pending') AS pending,
               count(*) FILTER (WHERE r.status = 'running') AS running,
               count(*) FILTER (WHERE r.status = 'waiting') AS waiting,
               count(*) FILTER (WHERE (r.status = 'pending' AND r.run_after <= clock_timestamp()
                                       AND (r.lease_worker_id IS NULL
                                            OR r.lease_expires_at < clock_timestamp()))
                                   OR (r.status = 'running'
                                       AND r.lease_expires_at < clock_timestamp()))
                   AS waiting_for_version,
               min(r.updated_at) FILTER (WHERE r.status = 'pending' AND r.lease_worker_id IS NULL)
                   AS oldest_pending_at
          FROM zeroth.runs r
          JOIN zeroth.deployments d ON d.deployment_ref = r.deployment_ref
         WHERE r.code_version_id IS NOT NULL
           AND r.status IN ('pending', 'running', 'waiting')
           AND r.started_at IS NOT NULL
           AND d.version_policy <> 'any'
         GROUP BY r.tenant_id, r.workspace_id, r.deployment_ref, r.code_version_id,
                  d.version_policy) AS p;
COMMENT ON VIEW zeroth.pinned_runs IS 'Code versions (issue 34): the active started runs that recorded a code version, per (tenant, workspace, deployment, version), in deployments whose version_policy is not any (only a worker of an allowed version resumes them): pending, running, waiting, waiting_for_version (due pending runs nobody holds, running runs whose lease expired: work for a worker of that version) and oldest_pending_at. Runs pinned to a version no worker serves any more leave through zeroth.retire_code_version (move or fail). Uses runs_code_version_active_idx.';
ALTER VIEW zeroth.pinned_runs OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.pinned_runs FROM PUBLIC;
GRANT SELECT ON zeroth.pinned_runs TO zeroth_reader;
