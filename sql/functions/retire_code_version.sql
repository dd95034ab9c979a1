-- retire_code_version: admin (issue 34, item 3), the way out for the runs of a code version no
-- worker serves any more (a fleet's old version drained). The active runs of deployment_ref that
-- recorded code_version and started (every scope; a run never started is pinned to no version:
-- every claim may take it, so it is neither moved nor failed): action 'move' → they record to_version instead (NULL:
-- unversioned, resumable by every version), whatever their status (pending, running, waiting: a
-- live holder keeps its lease; its runs' next recovery follows the new version); action 'fail' →
-- each one nobody holds ends: an expired lease is taken over first (zeroth._take_over, the
-- attempt counted: requeued, or dead-lettered when out of attempts), then every pending one
-- becomes failed and dead-lettered with {stop_reason code_version_retired, message}
-- (redrive_run brings one back, pinned to its version: move first). Runs with a live lease, and
-- waiting runs, are left (runs_left): retire again once they are pending. Rows another session
-- holds right now are skipped (SKIP LOCKED) and counted in runs_left. Audited in
-- zeroth.code_version_changes (action move / fail, run_count). Granted to nobody: run it as a
-- member of zeroth_owner. Raises ZP008. Notifies zeroth_wakeup per scope of a moved or requeued
-- run. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.retire_code_version(
    deployment_ref text,
    code_version   text,
    action         text,
    to_version     text DEFAULT NULL,
    message        text DEFAULT NULL)
    RETURNS TABLE (runs_changed integer, runs_left integer)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '2s' AS $$
DECLARE
    v_now     timestamptz := zeroth._now();
    v_changed integer := 0;
    v_n       integer;
    v_left    integer;
    v_run     record;
    v_message text;
    v_scopes  jsonb;
    v_from    bigint;  -- version keys (zeroth._code_version_hash)
    v_to      bigint;
BEGIN
    PERFORM zeroth._require_identifier(retire_code_version.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require(retire_code_version.code_version IS NOT NULL, 'code_version is required');
    PERFORM zeroth._check_code_version(retire_code_version.code_version);
    PERFORM zeroth._require(retire_code_version.action IN ('move', 'fail'), 'action must be move or fail');
    PERFORM zeroth._check_code_version(retire_code_version.to_version, 'to_version');
    PERFORM zeroth._require(retire_code_version.action = 'move' OR retire_code_version.to_version IS NULL,
                            'to_version is only for action move');
    PERFORM zeroth._require(retire_code_version.to_version IS DISTINCT FROM retire_code_version.code_version,
                            'to_version must differ from code_version');
    PERFORM zeroth._require(retire_code_version.message IS NULL OR length(retire_code_version.message) <= 1000,
                            'message must be at most 1000 characters');
    v_from := zeroth._code_version_hash(retire_code_version.code_version);
    v_to := zeroth._code_version_id(retire_code_version.to_version);
    v_message := coalesce(retire_code_version.message, format(
        'code version %s was retired: no worker serves it any more', retire_code_version.code_version));

    IF retire_code_version.action = 'move' THEN
        WITH locked AS (
            SELECT r.ctid FROM zeroth.runs r
             WHERE r.deployment_ref = retire_code_version.deployment_ref
               AND r.code_version_id = v_from
               AND r.started_at IS NOT NULL  -- never started: claimable by every version
               AND r.status IN ('pending', 'running', 'waiting')
               FOR UPDATE SKIP LOCKED
        ), moved AS (
            UPDATE zeroth.runs r
               SET code_version_id = v_to, updated_at = v_now
              FROM locked l
             WHERE r.ctid = l.ctid
            RETURNING r.tenant_id, r.workspace_id, r.status
        )
        SELECT count(*)::integer,
               coalesce(jsonb_agg(DISTINCT jsonb_build_array(m.tenant_id, m.workspace_id))
                            FILTER (WHERE m.status = 'pending'), '[]')
          INTO v_changed, v_scopes
          FROM moved m;
        -- A moved pending run may be claimable by a waiting worker now.
        FOR v_run IN SELECT e ->> 0 AS tenant_id, e ->> 1 AS workspace_id
                       FROM jsonb_array_elements(v_scopes) AS e LOOP
            PERFORM zeroth._notify_wakeup(retire_code_version.deployment_ref, v_run.tenant_id,
                                          v_run.workspace_id);
        END LOOP;
    ELSE
        -- 1. Nobody holds these any more: the takeover ends or requeues each (SKIP LOCKED inside).
        FOR v_run IN
            SELECT r.tenant_id, r.workspace_key, r.run_id FROM zeroth.runs r
             WHERE r.deployment_ref = retire_code_version.deployment_ref
               AND r.code_version_id = v_from
               AND r.started_at IS NOT NULL  -- never started: claimable by every version
               AND r.status IN ('pending', 'running')
               AND r.lease_expires_at < v_now
        LOOP
            SELECT count(*) FILTER (WHERE t.outcome <> 'requeued')::integer INTO v_n
              -- Isolated: a run whose takeover raises is rolled back and dead-lettered alone
              -- (recovery_failed), one that waits too long for a lock is left; the others go on.
              FROM zeroth._take_over_isolated(v_run.tenant_id, v_run.workspace_key, v_run.run_id,
                                              interval '0', v_now, 'code_version_retired',
                                              v_message) AS t;
            v_changed := v_changed + v_n;
        END LOOP;
        -- 2. Every pending one nobody holds: failed and dead-lettered.
        WITH locked AS (
            SELECT r.ctid FROM zeroth.runs r
             WHERE r.deployment_ref = retire_code_version.deployment_ref
               AND r.code_version_id = v_from
               AND r.started_at IS NOT NULL  -- never started: claimable by every version
               AND r.status = 'pending'
               AND r.lease_worker_id IS NULL
               FOR UPDATE SKIP LOCKED
        )
        UPDATE zeroth.runs r
           SET status = t.to_status,
               error = zeroth._stop_error('code_version_retired', v_message, NULL, NULL, r.error),
               dead_lettered_at = v_now,
               finished_at = v_now,
               updated_at = v_now
          FROM locked l, zeroth.run_transitions t
         WHERE r.ctid = l.ctid
           -- only along the listed edge (edge 60): a DBA who removed it forbade this end
           AND t.from_status = 'pending' AND t.outcome = 'version_retired';
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_changed := v_changed + v_n;
    END IF;

    v_left := (SELECT count(*) FROM zeroth.runs r
                WHERE r.deployment_ref = retire_code_version.deployment_ref
                  AND r.code_version_id = v_from
                  AND r.started_at IS NOT NULL
                  AND r.status IN ('pending', 'running', 'waiting'));
    INSERT INTO zeroth.code_version_changes (deployment_ref, changed_at, changed_by, acting_role, action,
                                             code_version, to_version, run_count, message)
    VALUES (retire_code_version.deployment_ref, v_now, session_user, nullif(current_setting('role'), 'none'),
            retire_code_version.action, retire_code_version.code_version, retire_code_version.to_version,
            v_changed, CASE WHEN retire_code_version.action = 'fail' THEN v_message END);
    RETURN QUERY SELECT v_changed, v_left;
END
$$;
COMMENT ON FUNCTION zeroth.retire_code_version(text, text, text, text, text) IS
'retire_code_version: admin. The active runs of deployment_ref (every scope) that recorded code_version: move → they record to_version (NULL: unversioned, resumable by every version), whatever their status (a live holder keeps its lease); fail → those nobody holds end: an expired lease is taken over first (attempt counted: requeued, or dead-lettered out of attempts), then every pending one is failed and dead-lettered with stop_reason code_version_retired and the message. Runs with a live lease, waiting runs (fail) and rows another session holds right now (SKIP LOCKED) are left: runs_left counts what still records code_version. Audited in zeroth.code_version_changes. Granted to nobody. Raises ZP008. Notifies zeroth_wakeup per scope of a moved pending run and for taken-over runs. Time: clock_timestamp().';
ALTER FUNCTION zeroth.retire_code_version(text, text, text, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.retire_code_version(text, text, text, text, text) FROM PUBLIC;
