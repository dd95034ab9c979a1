-- sql/functions/internal/slots.sql: admission slots (max_concurrency): take (the settle path
-- locks and frees them: internal/settle.sql).
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions). Re-applied by every upgrade (sql/README.md).

-- Replaced by the settle path's one lock prologue (zeroth._lock_settle, internal/settle.sql).
DROP FUNCTION IF EXISTS zeroth._lock_lease_end(text, text, uuid, text, bigint);
DROP FUNCTION IF EXISTS zeroth._lock_slot(text, text, uuid, bigint);

-- Freed by the settle path now, for the takeovers too (zeroth._settle).
DROP FUNCTION IF EXISTS zeroth._free_slot(text, text, uuid, bigint);

-- Takes up to `wanted` free admission slots of a scope, creating the scope's K slot rows on first
-- use. active_count is the number of slots whose lease is live (slots numbered above K, left by a
-- claimer with a larger K, count too, so the live leases never exceed the smallest K in use).
--
-- A slot is free when it names nothing, or its run no longer holds the named lease in it, or that
-- lease expired. The candidates are locked FOR UPDATE SKIP LOCKED (a slot locked by another
-- session is being claimed or freed right now). A candidate whose run still names it (its worker
-- died: the lease expired without a completion) is only reused after its lease is retired: the
-- run row is locked SKIP LOCKED, re-checked on its newest version, and its admission_slot cleared.
-- That write is what makes reuse safe: a renewal of the old lease that waits on the row re-checks
-- its fence against the clock after we commit and is refused; a renewal that holds the row makes
-- us skip the slot. So no lease can be renewed into a slot that was given away.
CREATE OR REPLACE FUNCTION zeroth._take_slots(
    tenant_id text, workspace_key text, deployment_ref text, max_concurrency integer, wanted integer,
    at timestamptz, OUT slots integer[], OUT active_count integer)
    LANGUAGE plpgsql VOLATILE
    SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_free    integer[];
    v_locked  integer[];
    v_named   integer[];
    v_runs    uuid[];
    v_retired integer[];
    v_lock_timeout text;
BEGIN
    -- The scope becomes slot rows: bound what would be written (K rows, indexed keys).
    PERFORM zeroth._require(_take_slots.max_concurrency <= 10000, 'max_concurrency must be at most 10000');
    PERFORM zeroth._require_identifier(_take_slots.tenant_id, 'tenant_id');
    PERFORM zeroth._require(length(_take_slots.workspace_key) <= 202,
                            'workspace_id must be at most 200 characters');
    -- First use of a scope (or a larger K): create the slot rows. Claims never wait, and an
    -- INSERT that conflicts with another claimer's uncommitted slot rows would wait for its
    -- transaction: so the INSERT runs in a subtransaction with a 10 ms lock_timeout, and a claimer
    -- that would wait finds no free slot this time (it reports saturation until the rows
    -- commit). Only claimers of this very scope can be in the way: no lock is shared with any
    -- other scope (0008 took a stripe of zeroth.lock_stripes, computable and shared by every
    -- tenant: red-team finding F1). The subtransaction is paid once per scope and K.
    IF NOT EXISTS (SELECT 1
                     FROM zeroth.admission_slots s
                    WHERE s.tenant_id = _take_slots.tenant_id
                      AND s.workspace_key = _take_slots.workspace_key
                      AND s.deployment_ref = _take_slots.deployment_ref
                      AND s.slot_no = _take_slots.max_concurrency) THEN
        v_lock_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '10ms', true);
            INSERT INTO zeroth.admission_slots (tenant_id, workspace_key, deployment_ref, slot_no)
            SELECT _take_slots.tenant_id, _take_slots.workspace_key, _take_slots.deployment_ref, g.n
              FROM generate_series(1, _take_slots.max_concurrency) AS g(n)
            ON CONFLICT DO NOTHING;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            NULL;  -- rolled back, lock_timeout with it
        END;
    END IF;

    -- One pass over the scope's slots: which lease is live (a primary-key probe of its run;
    -- OFFSET 0 keeps it one: the planner never hashes a sub-select with an OFFSET, and a hashed
    -- one read every run of the scope in a plan made before zeroth.runs' first ANALYZE).
    SELECT count(*) FILTER (WHERE x.live)::integer,
           coalesce(array_agg(x.slot_no ORDER BY x.slot_no)
                        FILTER (WHERE NOT x.live AND x.slot_no <= _take_slots.max_concurrency), '{}')
      INTO active_count, v_free
      FROM (SELECT s.slot_no,
                   s.run_id IS NOT NULL AND EXISTS (
                       SELECT 1 FROM zeroth.runs r
                        WHERE r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                          AND r.run_id = s.run_id
                          AND r.lease_generation = s.lease_generation
                          AND r.admission_slot = s.slot_no
                          AND r.lease_expires_at >= _take_slots.at
                       OFFSET 0) AS live
              FROM zeroth.admission_slots s
             WHERE s.tenant_id = _take_slots.tenant_id
               AND s.workspace_key = _take_slots.workspace_key
               AND s.deployment_ref = _take_slots.deployment_ref) x;

    IF least(_take_slots.wanted, _take_slots.max_concurrency - active_count) <= 0 OR cardinality(v_free) = 0 THEN
        slots := '{}';
        RETURN;
    END IF;

    WITH locked AS MATERIALIZED (
        SELECT s.slot_no, s.run_id
          FROM zeroth.admission_slots s
         WHERE s.tenant_id = _take_slots.tenant_id
           AND s.workspace_key = _take_slots.workspace_key
           AND s.deployment_ref = _take_slots.deployment_ref
           AND s.slot_no = ANY (v_free)
         ORDER BY s.slot_no
         LIMIT least(_take_slots.wanted, _take_slots.max_concurrency - active_count)
           FOR UPDATE OF s SKIP LOCKED
    )
    SELECT coalesce(array_agg(l.slot_no ORDER BY l.slot_no), '{}') INTO v_locked FROM locked l;

    -- Under the slot locks, in a new snapshot: which of them does their run still name? One
    -- primary-key probe per locked slot (OFFSET 0: never a join, never hashed). Not a join by
    -- primary key with the array: this function's plans are generic and may have been made on
    -- an empty table (a join by filter walked the scope, issue 13) or before the first ANALYZE
    -- (runs_pkey with only the scope as index condition walked it on PostgreSQL 15, issue 30).
    SELECT coalesce(array_agg(s.slot_no), '{}'), coalesce(array_agg(s.run_id), '{}')
      INTO v_named, v_runs
      FROM zeroth.admission_slots s
     WHERE s.tenant_id = _take_slots.tenant_id
       AND s.workspace_key = _take_slots.workspace_key
       AND s.deployment_ref = _take_slots.deployment_ref
       AND s.slot_no = ANY (v_locked)
       AND s.run_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM zeroth.runs r
                    WHERE r.tenant_id = _take_slots.tenant_id
                      AND r.workspace_key = _take_slots.workspace_key
                      AND r.run_id = s.run_id
                      AND r.lease_generation = s.lease_generation
                      AND r.admission_slot = s.slot_no
                   OFFSET 0);

    v_retired := '{}';
    IF cardinality(v_named) > 0 THEN
        WITH dead AS MATERIALIZED (
            SELECT r.tenant_id, r.workspace_key, r.run_id, s.slot_no
              FROM zeroth.admission_slots s
              JOIN zeroth.runs r ON r.tenant_id = s.tenant_id AND r.workspace_key = s.workspace_key
                                AND r.run_id = s.run_id
             WHERE s.tenant_id = _take_slots.tenant_id
               AND s.workspace_key = _take_slots.workspace_key
               AND s.deployment_ref = _take_slots.deployment_ref
               AND s.slot_no = ANY (v_named)
               AND r.tenant_id = _take_slots.tenant_id AND r.workspace_key = _take_slots.workspace_key
               AND r.run_id = ANY (v_runs)
               AND r.lease_generation = s.lease_generation
               AND r.admission_slot = s.slot_no
               AND r.lease_expires_at < _take_slots.at
               FOR UPDATE OF r SKIP LOCKED
        ), retired AS (
            UPDATE zeroth.runs r
               SET admission_slot = NULL
              FROM dead d
             WHERE r.tenant_id = _take_slots.tenant_id AND r.workspace_key = _take_slots.workspace_key
               AND r.run_id = ANY (v_runs) AND r.run_id = d.run_id
            RETURNING d.slot_no
        )
        SELECT coalesce(array_agg(x.slot_no), '{}') INTO v_retired FROM retired x;
    END IF;

    slots := ARRAY(SELECT u FROM unnest(v_locked) AS u
                    WHERE u <> ALL (v_named) OR u = ANY (v_retired)
                    ORDER BY u);
END
$$;
COMMENT ON FUNCTION zeroth._take_slots(text, text, text, integer, integer, timestamptz) IS 'Internal: lock up to `wanted` free concurrency slots of a scope (SKIP LOCKED), retiring the expired leases they still name, and report the live-slot count.';
ALTER FUNCTION zeroth._take_slots(text, text, text, integer, integer, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._take_slots(text, text, text, integer, integer, timestamptz) FROM PUBLIC;
