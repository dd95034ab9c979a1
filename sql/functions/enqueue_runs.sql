-- Parses and checks the items of an enqueue_runs batch: one row per item, in input order, typed,
-- each with the run_id it will get (the caller's or a fresh one). Raises ZP008 naming the first
-- bad item, so nothing is written. The casts run for the whole batch at once; only when one fails
-- are the items cast one by one, to say which. Nothing is written inside the EXCEPTION block, so
-- its subtransaction never takes a transaction id. An item without priority / max_attempts gets
-- default_priority / default_max_attempts (the deployment's registered defaults, else 0 / 3).
DROP FUNCTION IF EXISTS zeroth._enqueue_items(jsonb);
CREATE OR REPLACE FUNCTION zeroth._enqueue_items(runs jsonb, default_priority integer, default_max_attempts integer)
    RETURNS zeroth.enqueue_item[]
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_items zeroth.enqueue_item[];
    v_item  jsonb;
    v_index bigint;
    v_error text;
BEGIN
    PERFORM zeroth._require(jsonb_typeof(_enqueue_items.runs) = 'array', 'runs must be a JSON array');
    PERFORM zeroth._require(jsonb_array_length(_enqueue_items.runs) <= 10000, 'runs may hold at most 10000 items');
    SELECT format('runs[%s] %s', e.position,
                  CASE WHEN jsonb_typeof(e.item) <> 'object' THEN 'must be a JSON object'
                       ELSE format('has an unknown key %L',
                                   (SELECT k FROM jsonb_object_keys(e.item) AS k
                                     WHERE k NOT IN ('payload', 'priority', 'run_after', 'max_attempts',
                                                     'idempotency_key', 'metadata', 'run_id', 'thread_id',
                                                     'attempt_timeout_seconds', 'run_timeout_seconds')
                                     ORDER BY k LIMIT 1)) END)
      INTO v_error
      FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
     WHERE jsonb_typeof(e.item) <> 'object'
        OR EXISTS (SELECT 1 FROM jsonb_object_keys(e.item) AS k
                    WHERE k NOT IN ('payload', 'priority', 'run_after', 'max_attempts', 'idempotency_key',
                                    'metadata', 'run_id', 'thread_id', 'attempt_timeout_seconds',
                                    'run_timeout_seconds'))
     ORDER BY e.position
     LIMIT 1;
    PERFORM zeroth._require(v_error IS NULL, v_error);

    BEGIN
        v_items := ARRAY(
            SELECT ROW(e.position,
                       coalesce(e.item -> 'payload', '{}'::jsonb),
                       coalesce((e.item ->> 'priority')::integer, _enqueue_items.default_priority),
                       (e.item ->> 'run_after')::timestamptz,
                       coalesce((e.item ->> 'max_attempts')::integer, _enqueue_items.default_max_attempts),
                       e.item ->> 'idempotency_key',
                       coalesce(e.item -> 'metadata', '{}'::jsonb),
                       (e.item ->> 'run_id')::uuid,
                       e.item ->> 'thread_id',
                       coalesce((e.item ->> 'run_id')::uuid, gen_random_uuid()),
                       (e.item ->> 'attempt_timeout_seconds')::integer,
                       (e.item ->> 'run_timeout_seconds')::integer)::zeroth.enqueue_item
              FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
             ORDER BY e.position);
    EXCEPTION
        -- Any data exception (class 22: a bad number, uuid or timestamp, an unknown time zone)
        -- is the caller's bad item, ZP008, never another class.
        WHEN data_exception THEN
            FOR v_item, v_index IN
                SELECT e.item, e.position
                  FROM jsonb_array_elements(_enqueue_items.runs) WITH ORDINALITY AS e(item, position)
                 ORDER BY e.position
            LOOP
                BEGIN
                    PERFORM (v_item ->> 'priority')::integer, (v_item ->> 'run_after')::timestamptz,
                            (v_item ->> 'max_attempts')::integer, (v_item ->> 'run_id')::uuid,
                            (v_item ->> 'attempt_timeout_seconds')::integer,
                            (v_item ->> 'run_timeout_seconds')::integer;
                EXCEPTION
                    WHEN data_exception THEN
                        RAISE EXCEPTION 'runs[%]: %', v_index, SQLERRM USING ERRCODE = 'ZP008';
                END;
            END LOOP;
            RAISE EXCEPTION 'runs: %', SQLERRM USING ERRCODE = 'ZP008';
    END;

    SELECT format('runs[%s]: %s', i.position,
                  CASE WHEN jsonb_typeof(i.payload) IS DISTINCT FROM 'object' THEN 'payload must be a JSON object'
                       WHEN jsonb_typeof(i.metadata) IS DISTINCT FROM 'object' THEN 'metadata must be a JSON object'
                       WHEN i.max_attempts NOT BETWEEN 1 AND 1000 THEN 'max_attempts must be between 1 and 1000'
                       WHEN NOT isfinite(i.run_after) THEN 'run_after must be a finite timestamp'
                       WHEN length(i.idempotency_key) NOT BETWEEN 1 AND 500
                           THEN 'idempotency_key must be NULL or 1 to 500 characters'
                       WHEN i.attempt_timeout_seconds NOT BETWEEN 1 AND 86400 * 30
                           THEN 'attempt_timeout_seconds must be NULL or in [1, 2592000] (30 days)'
                       WHEN i.run_timeout_seconds NOT BETWEEN 1 AND 86400 * 365
                           THEN 'run_timeout_seconds must be NULL or in [1, 31536000] (365 days)'
                       ELSE 'thread_id must be a non-empty string of at most 200 characters' END)
      INTO v_error
      FROM unnest(v_items) AS i
     WHERE jsonb_typeof(i.payload) IS DISTINCT FROM 'object'
        OR jsonb_typeof(i.metadata) IS DISTINCT FROM 'object'
        OR i.max_attempts NOT BETWEEN 1 AND 1000
        OR NOT isfinite(i.run_after)
        OR length(i.idempotency_key) NOT BETWEEN 1 AND 500
        OR i.attempt_timeout_seconds NOT BETWEEN 1 AND 86400 * 30
        OR i.run_timeout_seconds NOT BETWEEN 1 AND 86400 * 365
        OR i.thread_id = '' OR length(i.thread_id) > 200
     ORDER BY i.position
     LIMIT 1;
    PERFORM zeroth._require(v_error IS NULL, v_error);
    RETURN v_items;
END
$$;
COMMENT ON FUNCTION zeroth._enqueue_items(jsonb, integer, integer) IS 'Internal: the items of an enqueue_runs batch, parsed and checked (ZP008 naming the first bad one), each with the run_id it will get and the given defaults where it names no priority / max_attempts.';
ALTER FUNCTION zeroth._enqueue_items(jsonb, integer, integer) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._enqueue_items(jsonb, integer, integer) FROM PUBLIC;

-- The writes of one enqueue_runs batch: every thread lock (in thread_id order) and the threads'
-- active runs (in run_id order), then the runs without a thread (one statement: INSERT ... ON
-- CONFLICT for those with a key or a run_id, a plain INSERT for the rest), then each thread item
-- admitted. Returns what was created, for the caller to report; enqueue_runs may run it again
-- after a deadlock (see there).
CREATE OR REPLACE FUNCTION zeroth._enqueue_batch(
    tenant_id text, workspace_key text, workspace_id text, deployment_ref text,
    items zeroth.enqueue_item[], at timestamptz,
    OUT created uuid[], OUT keys text[], OUT t_pos bigint[], OUT t_run uuid[],
    OUT t_created boolean[], OUT t_status zeroth.run_status[])
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_item     zeroth.enqueue_item;
    v_thread   text;
    v_threads  text[];
    v_active   uuid[];
    v_admitted zeroth.admission;
BEGIN
    t_pos := '{}'; t_run := '{}'; t_created := '{}'; t_status := '{}';
    -- Every thread lock first, in thread_id order, so two batches naming the same threads in any
    -- order take them in one order.
    SELECT coalesce(array_agg(DISTINCT i.thread_id ORDER BY i.thread_id), '{}') INTO v_threads
      FROM unnest(_enqueue_batch.items) AS i
     WHERE i.thread_id IS NOT NULL;
    FOREACH v_thread IN ARRAY v_threads LOOP
        PERFORM zeroth._lock_thread(_enqueue_batch.tenant_id, _enqueue_batch.workspace_key, v_thread);
    END LOOP;
    -- Then the active runs of those threads, the way complete_runs and renew_leases lock a
    -- worker's runs: their slot rows, then the run rows, each in run_id order. Each admission
    -- below locks its thread's active run again (already held). Locked item by item instead, a
    -- batch naming two busy threads against the order of their runs' ids would deadlock with the
    -- worker renewing or completing both.
    IF cardinality(v_threads) > 0 THEN
        -- One probe of runs_thread_active_idx per thread (at most one active run each: the
        -- index is unique). A LATERAL sub-select with a LIMIT is never flattened, so the thread
        -- is always in the index condition: by `thread_id = ANY (v_threads)`, a generic plan made
        -- on a small table put only the scope there on PostgreSQL 15 and filtered every active
        -- thread run of the scope (1,000 threads: 1,004 tuples, 687 blocks; issue 30).
        SELECT coalesce(array_agg(r.run_id), '{}') INTO v_active
          FROM unnest(v_threads) AS t(thread_id)
         CROSS JOIN LATERAL (
                SELECT x.run_id
                  FROM zeroth.runs x
                 WHERE x.tenant_id = _enqueue_batch.tenant_id
                   AND x.workspace_key = _enqueue_batch.workspace_key
                   AND x.thread_id = t.thread_id
                   AND x.status IN ('pending', 'running', 'waiting')
                   AND x.thread_queued_at IS NULL
                 LIMIT 1) r;
        -- One probe of admission_slots_run_idx per run, as complete_runs does (by filter, a
        -- generic plan walked every slot of the scope).
        PERFORM 1
          FROM (SELECT a.run_id FROM unnest(v_active) AS a(run_id) ORDER BY a.run_id) a
         CROSS JOIN LATERAL (
                SELECT s.slot_no
                  FROM zeroth.admission_slots s
                 -- The scope by IS NOT DISTINCT FROM: by admission_slots_run_idx whatever the
                 -- statistics (see zeroth._lock_settle).
                 WHERE s.run_id = a.run_id
                   AND (s.tenant_id, s.workspace_key) IS NOT DISTINCT FROM
                       (_enqueue_batch.tenant_id, _enqueue_batch.workspace_key)
                   FOR UPDATE OF s) l;
        -- The runs: one primary-key probe each, in run_id order (a LATERAL sub-select with a
        -- locking clause is never flattened into a join). By the array, a plan made before the
        -- first ANALYZE put only the scope in runs_pkey's index condition and walked every run
        -- of the scope on PostgreSQL 15 (issue 30).
        PERFORM 1
          FROM (SELECT a.run_id FROM unnest(v_active) AS a(run_id) ORDER BY a.run_id) a
         CROSS JOIN LATERAL (
                SELECT 1 FROM zeroth.runs r
                 WHERE r.tenant_id = _enqueue_batch.tenant_id
                   AND r.workspace_key = _enqueue_batch.workspace_key
                   AND r.run_id = a.run_id
                   FOR UPDATE OF r) l;
    END IF;

    -- The runs without a thread, in one statement: those that name a key (an idempotency key or
    -- their own run_id) by INSERT ... ON CONFLICT DO NOTHING, in key order; the others (a fresh
    -- gen_random_uuid() and no key: nothing to conflict with) by a plain INSERT. ON CONFLICT
    -- inserts speculatively and confirms each row with a WAL record of its own (HEAP_CONFIRM, 48
    -- bytes a run: issue 30, item 3); a collision of fresh ids would raise unique_violation
    -- instead of passing unseen.
    -- Each run of the batch is created (created_at, updated_at) a microsecond after the one before
    -- it in the batch (item k: at + (k - 1) µs; never later than its row was really written,
    -- which takes longer than that): the runs of one batch have distinct claim-order positions
    -- (priority DESC, run_after, created_at), in input order, so a claim floor can name the
    -- exact run a claim stopped at inside a batch (issue 30, the dirty table: with one position
    -- for the whole batch every claim from a floor read the batch's claimed runs again). The
    -- runs with a thread keep the batch's time (admitted one by one below).
    WITH keyed AS (
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
            max_attempts, created_at, updated_at, payload, metadata, idempotency_key,
            attempt_timeout_seconds, run_timeout_seconds)
        SELECT i.new_run_id, _enqueue_batch.tenant_id, _enqueue_batch.workspace_id,
               _enqueue_batch.deployment_ref, 'pending', i.priority,
               coalesce(i.run_after, _enqueue_batch.at), i.max_attempts,
               _enqueue_batch.at + (i.position - 1) * interval '1 microsecond',
               _enqueue_batch.at + (i.position - 1) * interval '1 microsecond',
               i.payload, i.metadata, i.idempotency_key,
               i.attempt_timeout_seconds, i.run_timeout_seconds
          FROM unnest(_enqueue_batch.items) AS i
         WHERE i.thread_id IS NULL
           AND (i.idempotency_key IS NOT NULL OR i.run_id IS NOT NULL)
         ORDER BY i.idempotency_key, i.run_id, i.position
        ON CONFLICT DO NOTHING
        RETURNING r.run_id, r.idempotency_key
    ), plain AS (
        INSERT INTO zeroth.runs AS r (
            run_id, tenant_id, workspace_id, deployment_ref, status, priority, run_after,
            max_attempts, created_at, updated_at, payload, metadata, attempt_timeout_seconds,
            run_timeout_seconds)
        SELECT i.new_run_id, _enqueue_batch.tenant_id, _enqueue_batch.workspace_id,
               _enqueue_batch.deployment_ref, 'pending', i.priority,
               coalesce(i.run_after, _enqueue_batch.at), i.max_attempts,
               _enqueue_batch.at + (i.position - 1) * interval '1 microsecond',
               _enqueue_batch.at + (i.position - 1) * interval '1 microsecond',
               i.payload, i.metadata, i.attempt_timeout_seconds, i.run_timeout_seconds
          FROM unnest(_enqueue_batch.items) AS i
         WHERE i.thread_id IS NULL AND i.idempotency_key IS NULL AND i.run_id IS NULL
         ORDER BY i.position
        RETURNING r.run_id, r.idempotency_key
    )
    SELECT coalesce(array_agg(x.run_id), '{}'), coalesce(array_agg(x.idempotency_key), '{}')
      INTO created, keys
      FROM (SELECT k.run_id, k.idempotency_key FROM keyed k
            UNION ALL
            SELECT p.run_id, p.idempotency_key FROM plain p) x;

    -- The runs with a thread: each admitted (or queued) under the locks already held.
    FOR v_item IN SELECT i.* FROM unnest(_enqueue_batch.items) AS i WHERE i.thread_id IS NOT NULL ORDER BY i.position LOOP
        v_admitted := zeroth._admit(_enqueue_batch.tenant_id, _enqueue_batch.workspace_id, _enqueue_batch.deployment_ref,
                                    v_item.thread_id, true, NULL, v_item.payload, v_item.metadata, v_item.priority,
                                    v_item.run_after, v_item.max_attempts, v_item.idempotency_key, v_item.run_id,
                                    true, NULL, interval '0', _enqueue_batch.at, false);
        IF v_admitted.outcome <> 'reused'
           AND (v_item.attempt_timeout_seconds IS NOT NULL OR v_item.run_timeout_seconds IS NOT NULL) THEN
            -- A thread run's own timeouts (issue 34 item 2), as enqueue_run writes them.
            UPDATE zeroth.runs r
               SET attempt_timeout_seconds = v_item.attempt_timeout_seconds,
                   run_timeout_seconds = v_item.run_timeout_seconds
             WHERE r.tenant_id = _enqueue_batch.tenant_id
               AND r.workspace_key = _enqueue_batch.workspace_key
               AND r.run_id = v_admitted.run_id;
        END IF;
        t_pos := t_pos || v_item.position;
        t_run := t_run || v_admitted.run_id;
        t_created := t_created || (v_admitted.outcome <> 'reused');
        t_status := t_status || v_admitted.status;
    END LOOP;
END
$$;
COMMENT ON FUNCTION zeroth._enqueue_batch(text, text, text, text, zeroth.enqueue_item[], timestamptz) IS 'Internal: the writes of one enqueue_runs batch (thread locks in thread_id order, then the threads'' active runs in run_id order, one statement for the runs without a thread (INSERT ... ON CONFLICT for those with a key or a run_id, a plain INSERT for the rest), one admission per thread item); returns what was created.';
ALTER FUNCTION zeroth._enqueue_batch(text, text, text, text, zeroth.enqueue_item[], timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._enqueue_batch(text, text, text, text, zeroth.enqueue_item[], timestamptz) FROM PUBLIC;

-- enqueue_runs: enqueue_run for a batch of one deployment and scope, in one transaction and, for
-- the runs without a thread, one INSERT. runs is a JSON array of objects with optional keys
-- payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id,
-- attempt_timeout_seconds, run_timeout_seconds (since 0021: the run's own timeouts, as
-- enqueue_run's).
-- An item without priority / max_attempts gets the deployment's registered defaults
-- (zeroth.deployments, one primary-key lookup per batch), else 0 / 3.
-- Results come back in input order (ordinality); a repeated idempotency key or run_id — in the
-- database or earlier in the batch — returns that run with created = false. Every thread lock
-- the batch needs is taken first, in one sorted order, so two batches that share threads cannot
-- deadlock; the runs are inserted in (idempotency_key, run_id) order, so two batches that share
-- keys wait for each other in one order. Raises ZP006, ZP008, ZP011 (an idempotency key starting
-- 'zeroth-schedule:'): the whole batch is rejected, nothing written. Notifies zeroth_wakeup once when it created a pending run that is due now.
-- Time: clock_timestamp(); the k-th item without a thread is created (created_at) k - 1 µs after
-- it, so at equal priority and run_after the runs of a batch are claimed in input order.
CREATE OR REPLACE FUNCTION zeroth.enqueue_runs(
    deployment_ref text,
    runs           jsonb,
    tenant_id      text DEFAULT NULL,
    workspace_id   text DEFAULT NULL)
    RETURNS TABLE (ordinality bigint, run_id uuid, created boolean, status zeroth.run_status)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now       timestamptz := zeroth._now();
    v_tenant    text := zeroth._scope_tenant(enqueue_runs.tenant_id, enqueue_runs.workspace_id);
    v_wskey     text := zeroth._workspace_key(enqueue_runs.workspace_id);
    v_items     zeroth.enqueue_item[];
    v_batch     record;
    v_created   uuid[];
    v_keys      text[];
    v_t_pos     bigint[];
    v_t_run     uuid[];
    v_t_created boolean[];
    v_t_status  zeroth.run_status[];
    v_too_long  bigint;
    v_reserved  bigint;
    v_def_priority integer;
    v_def_attempts integer;
BEGIN
    -- The shared arguments are checked up front so an empty batch validates them too.
    IF v_tenant IS NULL THEN
        RAISE EXCEPTION 'a workspace_id needs a tenant_id' USING ERRCODE = 'ZP006';
    END IF;
    PERFORM zeroth._require_identifier(enqueue_runs.deployment_ref, 'deployment_ref');
    PERFORM zeroth._require_identifier(v_tenant, 'tenant_id');
    IF enqueue_runs.workspace_id IS NOT NULL THEN
        PERFORM zeroth._require_identifier(enqueue_runs.workspace_id, 'workspace_id');
    END IF;
    -- The deployment's registered defaults for the items that name none: one primary-key lookup
    -- per batch (no row: 0 / 3). An explicit value wins; each run keeps what it got.
    SELECT d.priority, d.max_attempts INTO v_def_priority, v_def_attempts
      FROM zeroth.deployments d
     WHERE d.deployment_ref = enqueue_runs.deployment_ref;
    v_items := zeroth._enqueue_items(enqueue_runs.runs, coalesce(v_def_priority, 0), coalesce(v_def_attempts, 3));
    -- The first item whose key is reserved for the schedules (ZP011 names it).
    SELECT min(i.position) INTO v_reserved
      FROM unnest(v_items) AS i
     WHERE starts_with(i.idempotency_key, 'zeroth-schedule:');
    IF v_reserved IS NOT NULL THEN
        PERFORM zeroth._require_caller_key(v_items[v_reserved].idempotency_key,
                                           format('runs[%s].idempotency_key', v_reserved));
    END IF;
    SELECT min(i.position) INTO v_too_long
      FROM unnest(v_items) AS i
     WHERE NOT zeroth._key_fits(v_tenant, v_wskey, enqueue_runs.deployment_ref, i.idempotency_key);
    IF v_too_long IS NOT NULL THEN
        RAISE EXCEPTION 'runs[%]: tenant_id, workspace_id, deployment_ref and idempotency_key must fit in 2600 bytes together',
            v_too_long USING ERRCODE = 'ZP008';
    END IF;

    -- Two batches can meet in a deadlock only through the keys they name (idempotency keys,
    -- caller-chosen run ids): one INSERT waits on the other's uncommitted key while the other
    -- waits on one of its own, in another unique index or in the thread items that follow. That
    -- needs batches that name the same keys in contradicting ways (the same run_id with two
    -- keys, a key as a thread item in one and a plain item in the other); PostgreSQL breaks the
    -- cycle after deadlock_timeout and the batch that lost runs again (its writes were undone
    -- with the subtransaction, so the retry sees the winner's runs as existing). It first gives
    -- the winner a moment: a retry that raced ahead would insert the contested key again before
    -- the winner, woken by the abort, had taken it, and close the same cycle. Batches without
    -- keys cannot conflict and pay for no subtransaction.
    IF EXISTS (SELECT 1 FROM unnest(v_items) AS i WHERE i.idempotency_key IS NOT NULL OR i.run_id IS NOT NULL) THEN
        FOR v_try IN 1..5 LOOP
            BEGIN
                v_batch := zeroth._enqueue_batch(v_tenant, v_wskey, enqueue_runs.workspace_id,
                                                 enqueue_runs.deployment_ref, v_items, v_now);
                EXIT;
            EXCEPTION WHEN deadlock_detected THEN
                IF v_try = 5 THEN
                    RAISE;
                END IF;
                PERFORM pg_sleep(0.02 * v_try * (1 + random()));
            END;
        END LOOP;
    ELSE
        v_batch := zeroth._enqueue_batch(v_tenant, v_wskey, enqueue_runs.workspace_id,
                                         enqueue_runs.deployment_ref, v_items, v_now);
    END IF;
    v_created := v_batch.created;
    v_keys := v_batch.keys;
    v_t_pos := v_batch.t_pos;
    v_t_run := v_batch.t_run;
    v_t_created := v_batch.t_created;
    v_t_status := v_batch.t_status;

    IF EXISTS (SELECT 1 FROM unnest(v_items) AS i
                WHERE i.new_run_id = ANY (v_created) AND coalesce(i.run_after, v_now) <= v_now) THEN
        PERFORM zeroth._notify_wakeup(enqueue_runs.deployment_ref, v_tenant, enqueue_runs.workspace_id);
    END IF;

    RETURN QUERY
    WITH both_sets AS (
        -- The items and the runs the batch inserted (run_id, key) in one set, so that each
        -- item's answer comes from one sort of it (window functions), whatever the plan: as a
        -- subplan per item over the inserted runs and the earlier items, 3,000 items made
        -- 9,000,000 comparisons (3.5 s of the call).
        SELECT i AS item, i.position, i.new_run_id AS run_id, i.idempotency_key,
               i.thread_id IS NULL AS plain, false AS inserted_run
          FROM unnest(v_items) AS i
        UNION ALL
        SELECT NULL::zeroth.enqueue_item, NULL::bigint, c.run_id, c.idempotency_key, true, true
          FROM unnest(v_created, v_keys) AS c(run_id, idempotency_key)
    ), judged AS (
        -- An item without a thread was created when a row with its run_id and key was inserted
        -- and no earlier item of the batch had the same run_id and key (a partition groups
        -- NULL keys together, as IS NOT DISTINCT FROM does).
        SELECT b.item, b.inserted_run,
               b.plain
               AND bool_or(b.inserted_run) OVER (PARTITION BY b.plain, b.run_id, b.idempotency_key)
               AND row_number() OVER (PARTITION BY b.plain, b.run_id, b.idempotency_key,
                                                   b.inserted_run
                                      ORDER BY b.position) = 1 AS inserted
          FROM both_sets b
    ), item AS MATERIALIZED (
        SELECT (j.item).*, j.inserted
          FROM judged j
         WHERE NOT j.inserted_run
    )
    SELECT i.position,
           coalesce(t.run_id, CASE WHEN i.inserted THEN i.new_run_id END, e.run_id),
           coalesce(t.created, i.inserted),
           coalesce(t.status, CASE WHEN i.inserted THEN 'pending'::zeroth.run_status END, e.status)
      FROM item i
      LEFT JOIN unnest(v_t_pos, v_t_run, v_t_created, v_t_status) AS t(position, run_id, created, status)
             ON t.position = i.position
      LEFT JOIN LATERAL (
          -- A run without a thread that was not inserted: the run holding its key or run_id, one
          -- branch per unique index, the run_id match first (an OR of the two filtered the whole
          -- scope per item in a generic plan made on a small table).
          SELECT x.run_id, x.status
            FROM (SELECT r.run_id, r.status, true AS by_run_id
                    FROM zeroth.runs r
                   WHERE i.thread_id IS NULL AND NOT i.inserted
                     AND r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                     AND r.run_id = i.run_id
                  UNION ALL
                  SELECT r.run_id, r.status, false
                    FROM zeroth.runs r
                   WHERE i.thread_id IS NULL AND NOT i.inserted
                     AND r.tenant_id = v_tenant AND r.workspace_key = v_wskey
                     AND r.deployment_ref = enqueue_runs.deployment_ref
                     AND r.idempotency_key = i.idempotency_key) x
           ORDER BY x.by_run_id DESC
           LIMIT 1) e ON true
     ORDER BY i.position;
END
$$;
COMMENT ON FUNCTION zeroth.enqueue_runs(text, jsonb, text, text) IS
'enqueue_runs: batch enqueue_run for one deployment and scope (one INSERT for the runs without a thread); runs is a JSON array of objects (payload, priority, run_after, max_attempts, idempotency_key, metadata, run_id, thread_id, attempt_timeout_seconds, run_timeout_seconds: the run''s own timeouts, whole seconds, 1 to 30 / 365 days); an item without priority / max_attempts gets the deployment''s registered defaults (zeroth.deployments), else 0 / 3. Results in input order; a repeated key or run_id returns that run with created = false. Thread locks are taken first in one sorted order, inserts run in key order: concurrent batches cannot deadlock on threads or keys. Raises ZP006, ZP008, ZP011 reserved_key (an idempotency key starting zeroth-schedule:, reserved for fire_due_schedules) and rejects the whole batch. Notifies zeroth_wakeup once when a due pending run was created. Time: clock_timestamp(); the k-th item without a thread is created (created_at) k - 1 microseconds after it, so at equal priority and run_after a batch is claimed in input order.';
ALTER FUNCTION zeroth.enqueue_runs(text, jsonb, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.enqueue_runs(text, jsonb, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.enqueue_runs(text, jsonb, text, text) TO zeroth_worker;
