-- save_checkpoint: append (or, with a known checkpoint_id, replace) a checkpoint of a running run,
-- fenced. The run row's checkpoint_seq and the checkpoint row are written in one call, so a refused
-- write leaves no checkpoint behind. Returns the checkpoint id, or NULL when fenced out.
-- Raises ZP003 (run not running), ZP007 (checkpoint_id of another run), ZP008. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.save_checkpoint(
    run_id        uuid,
    worker_id     text,
    generation    bigint,
    data          jsonb,
    checkpoint_id uuid DEFAULT NULL,
    tenant_id     text DEFAULT NULL,
    workspace_id  text DEFAULT NULL)
    RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_status zeroth.run_status;
    v_now    timestamptz := zeroth._now();
    v_tenant text := zeroth._scope_tenant(save_checkpoint.tenant_id, save_checkpoint.workspace_id);
    v_wskey  text := zeroth._workspace_key(save_checkpoint.workspace_id);
    v_seq    bigint;
    v_id     uuid;
BEGIN
    PERFORM zeroth._require(save_checkpoint.run_id IS NOT NULL, 'run_id must not be NULL');
    PERFORM zeroth._require_identifier(save_checkpoint.worker_id, 'worker_id');
    PERFORM zeroth._require(save_checkpoint.generation IS NOT NULL, 'generation must not be NULL');
    PERFORM zeroth._require(save_checkpoint.data IS NOT NULL, 'data must not be NULL');

    -- The run row first, then the clock: see zeroth._lock_leased_run.
    v_status := zeroth._lock_leased_run(v_tenant, v_wskey, save_checkpoint.run_id, save_checkpoint.worker_id, save_checkpoint.generation);
    v_now := zeroth._now();
    UPDATE zeroth.runs r
       SET checkpoint_seq = r.checkpoint_seq + 1,
           updated_at = v_now
     WHERE r.tenant_id = v_tenant
       AND r.workspace_key = v_wskey
       AND r.run_id = save_checkpoint.run_id
       AND v_status = 'running'
       AND r.lease_worker_id = save_checkpoint.worker_id
       AND r.lease_generation = save_checkpoint.generation
       AND r.lease_expires_at >= v_now
    RETURNING r.checkpoint_seq INTO v_seq;
    IF NOT FOUND THEN
        PERFORM zeroth._explain_fenced_miss(v_tenant, v_wskey, save_checkpoint.run_id, save_checkpoint.worker_id,
                                            save_checkpoint.generation, v_now, 'save_checkpoint', '{running}');
        RETURN NULL;
    END IF;

    INSERT INTO zeroth.checkpoints AS k (checkpoint_id, tenant_id, workspace_key, run_id, checkpoint_order,
                                         lease_generation, data, created_at)
    VALUES (coalesce(save_checkpoint.checkpoint_id, gen_random_uuid()), v_tenant, v_wskey, save_checkpoint.run_id,
            v_seq, save_checkpoint.generation, save_checkpoint.data, v_now)
    ON CONFLICT ON CONSTRAINT checkpoints_pkey DO UPDATE
       SET data = excluded.data, checkpoint_order = excluded.checkpoint_order,
           lease_generation = excluded.lease_generation, created_at = excluded.created_at
     WHERE k.tenant_id = excluded.tenant_id AND k.workspace_key = excluded.workspace_key AND k.run_id = excluded.run_id
    RETURNING k.checkpoint_id INTO v_id;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'checkpoint % belongs to another run', save_checkpoint.checkpoint_id USING ERRCODE = 'ZP007';
    END IF;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text) IS
'save_checkpoint: append a checkpoint (or replace one by checkpoint_id) of a running run, fenced by (worker_id, generation, live lease); run row and checkpoint written together. Returns the checkpoint id, or NULL when fenced out. Raises ZP003 (not running), ZP007 (checkpoint of another run), ZP008. Time: clock_timestamp().';
ALTER FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.save_checkpoint(uuid, text, bigint, jsonb, uuid, text, text) TO zeroth_worker;
