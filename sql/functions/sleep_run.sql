-- sleep_run: durable sleep. The live holder ends its attempt with "resume me at T": running →
-- pending with run_after = T (resume_at, or the database clock + delay_seconds; exactly one of
-- them, at most 366 days ahead; a T in the past is now), optionally saving `checkpoint` in the
-- same UPDATE so the resume point cannot be lost between two calls. The attempt is given back
-- (a sleep is not a failure), the lease and recovery id cleared, the slot freed; the run keeps
-- its thread's place (pending is active). A pending cancel request wins: → cancelled instead.
-- Returns one row (outcome sleeping | cancelled, run_after, checkpoint_id); outcome NULL: fenced out.
-- Raises ZP003, ZP008. Notifies zeroth_wakeup only when a slot was freed or T is now. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.sleep_run(
    run_id            uuid,
    worker_id         text,
    generation        bigint,
    resume_at         timestamptz      DEFAULT NULL,
    delay_seconds     double precision DEFAULT NULL,
    checkpoint        jsonb            DEFAULT NULL,
    tenant_id         text             DEFAULT NULL,
    workspace_id      text             DEFAULT NULL)
    RETURNS TABLE (outcome text, run_after timestamptz, checkpoint_id uuid)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(sleep_run.tenant_id, sleep_run.workspace_id);
    v_wskey  text := zeroth._workspace_key(sleep_run.workspace_id);
    v_max    constant interval := interval '366 days';
    v_at     timestamptz;
    v_lock   record;
    v_end    record;
BEGIN
    PERFORM zeroth._require((sleep_run.resume_at IS NULL) <> (sleep_run.delay_seconds IS NULL),
                            'give exactly one of resume_at and delay_seconds');
    PERFORM zeroth._require(sleep_run.resume_at IS NULL OR isfinite(sleep_run.resume_at),
                            'resume_at must be a finite timestamp');
    PERFORM zeroth._require(sleep_run.delay_seconds IS NULL
                            OR (sleep_run.delay_seconds <> 'NaN'::float8
                                AND sleep_run.delay_seconds >= 0
                                AND sleep_run.delay_seconds <= extract(epoch FROM v_max)),
                            format('delay_seconds must be in [0, %s], got %s',
                                   extract(epoch FROM v_max), sleep_run.delay_seconds));

    -- The settle path's lock (sql/functions/internal/settle.sql), then the clock: T is computed
    -- on this clock reading.
    PERFORM zeroth._require_fence(sleep_run.run_id, sleep_run.worker_id, sleep_run.generation);
    v_lock := zeroth._lock_settle(v_tenant, v_wskey, sleep_run.worker_id, ARRAY[sleep_run.run_id],
                                  ARRAY[sleep_run.generation]);
    v_now := zeroth._now();
    v_at := CASE WHEN sleep_run.delay_seconds IS NOT NULL
                 THEN v_now + make_interval(secs => sleep_run.delay_seconds)
                 ELSE greatest(sleep_run.resume_at, v_now) END;
    PERFORM zeroth._require(v_at <= v_now + v_max,
                            format('resume_at must be at most %s ahead of the database clock (%s), got %s',
                                   v_max, v_now, sleep_run.resume_at));

    -- One settle decides: sleeping, or cancelled when a cancel request is pending (the handler
    -- would be stopped for it anyway; going to sleep would hide the request until T). A sleep is
    -- not a failure: the attempt claim_and_start counted is given back, so a run may sleep any
    -- number of times; a crash after a resume still counts. The checkpoint is numbered by it.
    SELECT s.outcome, s.from_status, s.run_after, s.checkpoint_seq, s.sqlstate INTO v_end
      FROM zeroth._settle(v_tenant, v_wskey, sleep_run.worker_id, ARRAY[sleep_run.run_id],
                          ARRAY[sleep_run.generation], '{sleep}', ARRAY[sleep_run.checkpoint], ARRAY[v_at],
                          NULL, NULL, NULL, v_lock.run_rows, v_lock.slot_rows, v_now) s;
    PERFORM zeroth._raise_unlisted_edge('sleep_run', sleep_run.run_id, v_end.from_status, v_end.sqlstate);
    IF v_end.sqlstate IS NOT NULL THEN
        RETURN NEXT;  -- one row, outcome NULL: fenced out
        RETURN;
    END IF;

    IF v_end.outcome = 'slept' THEN
        outcome := 'sleeping';
        run_after := v_end.run_after;
        IF sleep_run.checkpoint IS NOT NULL THEN
            INSERT INTO zeroth.checkpoints AS k (checkpoint_id, tenant_id, workspace_key, run_id,
                                                 checkpoint_order, lease_generation, data, created_at)
            VALUES (gen_random_uuid(), v_tenant, v_wskey, sleep_run.run_id, v_end.checkpoint_seq,
                    sleep_run.generation, sleep_run.checkpoint, v_now)
            RETURNING k.checkpoint_id INTO checkpoint_id;
        END IF;
    ELSE
        outcome := 'cancelled';
    END IF;
    RETURN NEXT;
END
$$;
COMMENT ON FUNCTION zeroth.sleep_run(uuid, text, bigint, timestamptz, double precision, jsonb, text, text) IS
'sleep_run: durable sleep for the live lease (worker_id, generation): running → pending with run_after = resume_at (a past one = now) or database clock + delay_seconds (exactly one; at most 366 days ahead), optionally saving checkpoint in the same call (the next claim delivers the latest checkpoint as recovery_checkpoint). Gives the attempt back (not a failure), clears the lease, frees the slot, keeps the thread''s place. A pending cancel request wins: → cancelled. Returns one row (outcome sleeping | cancelled, run_after, checkpoint_id); outcome NULL when fenced out. Raises ZP003 (holder but not running), ZP008. Notifies zeroth_wakeup only when a slot was freed or the resume is due now. Time: clock_timestamp().';
ALTER FUNCTION zeroth.sleep_run(uuid, text, bigint, timestamptz, double precision, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.sleep_run(uuid, text, bigint, timestamptz, double precision, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.sleep_run(uuid, text, bigint, timestamptz, double precision, jsonb, text, text) TO zeroth_worker;
