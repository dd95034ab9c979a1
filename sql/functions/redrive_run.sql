-- redrive_run: failed or cancelled → pending (dead-letter redrive, operator replay), or → waiting
-- in the thread queue when its thread has an active run now. Resets attempts, hand_backs, error, output,
-- cancel and dead-letter marks and the attempt / run deadlines (the next claim fixes new ones);
-- never the lease generation, so fencing stays monotonic across
-- replays. Checkpoints are kept: the next claim hands the latest one to the handler, which
-- decides whether to resume from it. A child run's parent sees it as not ended again (trigger
-- runs_child_run_reopened: its outcome copy cleared, its parent's open waits recounted; a wait
-- already recorded keeps its outcomes). Locks: the thread's lock and active run (thread
-- runs), then the run row. Returns true. Raises ZP001 (unknown run), ZP003 (not failed/cancelled),
-- ZP008. Notifies zeroth_wakeup when the run became pending. The run's event stream: its END
-- (stored, or the one read_run_events made) becomes the event `redriven` at the same number, so
-- no END stands before the run's next end and no number a reader was given is reused.
-- Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.redrive_run(
    run_id       uuid,
    tenant_id    text DEFAULT NULL,
    workspace_id text DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(redrive_run.tenant_id, redrive_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(redrive_run.workspace_id);
    v_thread text;
    v_active zeroth.runs;
    v_queue  boolean := false;
    v_run    record;
    v_old    record;
BEGIN
    PERFORM zeroth._require(redrive_run.run_id IS NOT NULL, 'run_id must not be NULL');

    SELECT r.thread_id INTO v_thread FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = redrive_run.run_id;
    IF v_thread IS NOT NULL THEN
        PERFORM zeroth._lock_thread(v_tenant, v_wskey, v_thread);
        v_active := zeroth._lock_thread_active(v_tenant, v_wskey, v_thread, v_now);
        v_queue := v_active.run_id IS NOT NULL;
    END IF;

    -- The run as it ended (its END, for the stream below); the row lock the UPDATE takes anyway.
    SELECT r.status, r.dead_lettered_at, r.lease_generation, r.finished_at INTO v_old
      FROM zeroth.runs r
     WHERE r.tenant_id = v_tenant AND r.workspace_key = v_wskey AND r.run_id = redrive_run.run_id
       AND r.status IN ('failed', 'cancelled')
       FOR UPDATE;

    UPDATE zeroth.runs r
       SET status = CASE WHEN v_queue THEN 'waiting'::zeroth.run_status ELSE 'pending'::zeroth.run_status END,
           wait_reason = CASE WHEN v_queue THEN 'thread_queue' END,
           thread_queued_at = CASE WHEN v_queue THEN zeroth._queue_position(v_tenant, v_wskey, v_thread, v_now) END,
           attempts = 0,
           hand_backs = 0,
           run_after = v_now,
           error = NULL, output = NULL, finished_at = NULL, dead_lettered_at = NULL,
           cancel_action = NULL, cancel_requested_at = NULL,
           -- A replay starts the clock over: its next claim fixes new deadlines (issue 34 item 2).
           attempt_deadline_at = NULL, run_deadline_at = NULL,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = redrive_run.run_id
       AND r.status IN ('failed', 'cancelled')
    RETURNING r.deployment_ref, r.workspace_id INTO v_run;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_admin_miss(v_tenant, v_wskey, redrive_run.run_id, 'redrive_run', '{failed,cancelled}');
    END IF;
    -- The run event stream (issue 34): the END a reader may have been given is no longer the
    -- end. The stored END becomes an ordinary event `redriven` at its number; a run with no
    -- stored END (read_run_events made it from the status, numbered after the last event) gets
    -- that `redriven` event at that number. Either way the number stays taken (a reader resuming
    -- from it misses nothing the next attempt appends) and no END stands before the run's next
    -- end (a subscriber from the start reads on). The run row is locked (the UPDATE above), as
    -- append_run_event and zeroth._settle number under it.
    UPDATE zeroth.run_events e
       SET kind = 'event', name = 'redriven'
     WHERE e.tenant_id = v_tenant AND e.workspace_key = v_wskey AND e.run_id = redrive_run.run_id
       AND e.kind = 'end';
    IF NOT FOUND THEN
        INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id, kind, name, data,
                                       lease_generation, created_at)
        SELECT v_tenant, v_wskey, redrive_run.run_id,
               coalesce((SELECT max(l.event_id) FROM zeroth.run_events l
                          WHERE l.tenant_id = v_tenant AND l.workspace_key = v_wskey
                            AND l.run_id = redrive_run.run_id), 0) + 1,
               'event', 'redriven',
               jsonb_build_object('status', v_old.status,
                                  'outcome', CASE WHEN v_old.dead_lettered_at IS NOT NULL
                                                  THEN 'dead_lettered' ELSE v_old.status::text END),
               v_old.lease_generation, coalesce(v_old.finished_at, v_now);
    END IF;
    IF v_queue THEN
        PERFORM zeroth._mark_queue_changed(v_tenant, v_wskey, v_active.run_id);
    ELSE
        PERFORM zeroth._notify_wakeup(v_run.deployment_ref, v_tenant, v_run.workspace_id);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION zeroth.redrive_run(uuid, text, text) IS
'redrive_run: failed or cancelled → pending, or → waiting in the thread queue when its thread has an active run; resets attempts, hand_backs, error, output, cancel and dead-letter marks and the attempt / run deadlines (the next claim fixes new ones), never lease_generation. The run''s event stream: its END (stored, or the one read_run_events made) becomes the event ''redriven'' at the same number. A redriven child run is not ended for its parent again (its open waits wait for its next end; recorded waits keep their outcomes). Raises ZP001 (unknown run), ZP003 (not failed/cancelled), ZP008. Notifies zeroth_wakeup when the run became pending. Time: clock_timestamp().';
ALTER FUNCTION zeroth.redrive_run(uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.redrive_run(uuid, text, text) FROM PUBLIC;
