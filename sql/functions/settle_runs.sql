-- settle_runs: a worker ends a mixed batch of its runs in one call and one statement.
-- outcomes[i] for (run_ids[i], generations[i]): complete (outputs[i] as complete_run's output),
-- retry (fail_run retryable: backoff from retry_base_seconds/retry_max_seconds — both NULL, the
-- default: each run's deployment's registered policy, else 1 / 300 — while attempts <
-- max_attempts, else dead-lettered), fail (fail_run not retryable), both with errors[i] stored
-- bounded as fail_run's error, cancel (cancel_run), hand_back (hand_back_to_pending), timeout (issue
-- 34 item 2: the holder stopped its handler at the attempt's deadline: retried as retry, stop_reason
-- attempt_timeout with errors[i] kept as its previous error; past the run's deadline failed for
-- good: run_timed_out, stop_reason run_timeout). Each run is
-- fenced on its own (worker_id, its generation, a live lease) and settled through
-- zeroth.run_transitions: one row per requested run, in input order, with the outcome settled
-- (completed | retry_scheduled | failed | dead_lettered | cancelled | handed_back | timed_out |
-- run_timed_out) or NULL and a
-- sqlstate: ZP002 fenced out, ZP012 the run's status has no such edge (nothing changed for it;
-- the others settle). Locks: the admission slots, then the runs, each in run_id order. Raises
-- ZP008 (nothing changed). Notifies zeroth_wakeup once per deployment when slots were freed, a
-- retry is due at once or a run was handed back. Time: clock_timestamp().
CREATE OR REPLACE FUNCTION zeroth.settle_runs(
    worker_id          text,
    run_ids            uuid[],
    generations        bigint[],
    outcomes           text[],
    outputs            jsonb[]          DEFAULT NULL,
    errors             jsonb[]          DEFAULT NULL,
    retry_base_seconds double precision DEFAULT NULL,
    retry_max_seconds  double precision DEFAULT NULL,
    tenant_id          text             DEFAULT NULL,
    workspace_id       text             DEFAULT NULL)
    RETURNS TABLE (run_id uuid, outcome text, sqlstate text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    -- As complete_runs: a row another session holds is waited for at most this long, then 55P03.
    SET lock_timeout = '2s' AS $$
DECLARE
    v_tenant   text := zeroth._scope_tenant(settle_runs.tenant_id, settle_runs.workspace_id);
    v_wskey    text := zeroth._workspace_key(settle_runs.workspace_id);
    v_n        integer := coalesce(cardinality(settle_runs.run_ids), 0);
    v_payloads jsonb[];
    v_lock     record;
BEGIN
    PERFORM zeroth._require_identifier(settle_runs.worker_id, 'worker_id');
    PERFORM zeroth._require_lease_batch(settle_runs.run_ids, settle_runs.generations);
    -- One statement, the checks in order (the first false one raises): a lone failure settled
    -- here ran one statement per check (docs/performance.md, "Settling in batches").
    -- Every array pairs with run_ids by subscript: one dimension, indexed from 1.
    PERFORM zeroth._require(settle_runs.outcomes IS NOT NULL AND cardinality(settle_runs.outcomes) = v_n
                            AND coalesce(array_ndims(settle_runs.outcomes), 1) = 1
                            AND coalesce(array_lower(settle_runs.outcomes, 1), 1) = 1,
                            'outcomes must be a one-dimensional array indexed from 1, as long as run_ids'),
            zeroth._require(NOT EXISTS (SELECT 1 FROM unnest(settle_runs.outcomes) AS o(kind)
                                         WHERE o.kind IS NULL
                                            OR o.kind NOT IN ('complete', 'retry', 'fail', 'cancel', 'hand_back',
                                                              'timeout')),
                            'each outcome must be complete, retry, fail, cancel, hand_back or timeout'),
            zeroth._require(settle_runs.outputs IS NULL
                            OR (cardinality(settle_runs.outputs) = v_n
                                AND coalesce(array_ndims(settle_runs.outputs), 1) = 1
                                AND coalesce(array_lower(settle_runs.outputs, 1), 1) = 1),
                            'outputs must be NULL or a one-dimensional array indexed from 1, as long as run_ids'),
            zeroth._require(settle_runs.errors IS NULL
                            OR (cardinality(settle_runs.errors) = v_n
                                AND coalesce(array_ndims(settle_runs.errors), 1) = 1
                                AND coalesce(array_lower(settle_runs.errors, 1), 1) = 1),
                            'errors must be NULL or a one-dimensional array indexed from 1, as long as run_ids'),
            -- An output belongs to a completion, an error to a failure: one given to another
            -- outcome would be dropped silently.
            zeroth._require(NOT EXISTS (
                                SELECT 1 FROM generate_subscripts(settle_runs.outcomes, 1) AS g(i)
                                 WHERE (settle_runs.outputs[g.i] IS NOT NULL AND settle_runs.outcomes[g.i] <> 'complete')
                                    OR (settle_runs.errors[g.i] IS NOT NULL
                                        AND settle_runs.outcomes[g.i] NOT IN ('retry', 'fail', 'timeout'))),
                            'outputs[i] is for complete only, errors[i] for retry, fail and timeout only'),
            -- Both NULL: each retried run takes its deployment's registered policy (else 1 / 300),
            -- as fail_run does; or both given, for every run of the batch.
            zeroth._require((settle_runs.retry_base_seconds IS NULL AND settle_runs.retry_max_seconds IS NULL)
                            OR (settle_runs.retry_base_seconds >= 0
                                AND settle_runs.retry_max_seconds >= settle_runs.retry_base_seconds
                                AND settle_runs.retry_max_seconds <= 86400 * 30),
                            'need retry_base_seconds and retry_max_seconds both NULL (the registered policy) '
                            'or 0 <= retry_base_seconds <= retry_max_seconds <= 30 days');
    -- The error documents, bounded before any lock is taken (as fail_run's).
    v_payloads := ARRAY(SELECT CASE WHEN settle_runs.outcomes[g.i] = 'complete' THEN settle_runs.outputs[g.i]
                                    ELSE zeroth._bounded_error(settle_runs.errors[g.i]) END
                          FROM generate_subscripts(settle_runs.run_ids, 1) AS g(i) ORDER BY g.i);

    v_lock := zeroth._lock_settle(v_tenant, v_wskey, settle_runs.worker_id,
                                  settle_runs.run_ids, settle_runs.generations);
    RETURN QUERY
    SELECT s.run_id, CASE s.outcome WHEN 'retried' THEN 'retry_scheduled' ELSE s.outcome END, s.sqlstate
      FROM zeroth._settle(v_tenant, v_wskey, settle_runs.worker_id, settle_runs.run_ids,
                          settle_runs.generations, settle_runs.outcomes, v_payloads, NULL, NULL,
                          settle_runs.retry_base_seconds, settle_runs.retry_max_seconds,
                          v_lock.run_rows, v_lock.slot_rows, zeroth._now()) s
     ORDER BY s.ord;
END
$$;
COMMENT ON FUNCTION zeroth.settle_runs(text, uuid[], bigint[], text[], jsonb[], jsonb[], double precision, double precision, text, text) IS
'settle_runs: end a mixed batch of one worker''s runs in one statement: outcomes[i] complete (outputs[i]), retry (retryable failure with backoff from retry_base_seconds/retry_max_seconds — both NULL, the defaults: the run''s deployment''s registered policy, else 1 / 300 — dead-lettered when attempts are used up), fail (not retryable), both with errors[i] stored bounded, cancel, hand_back, timeout (the holder stopped its handler at the attempt''s deadline: retried with backoff as retry, or dead-lettered, with error {stop_reason attempt_timeout}; past the run''s deadline failed for good, {stop_reason run_timeout}; errors[i] kept as the previous error); each fenced on (worker_id, generations[i], live lease) and settled only along an edge of zeroth.run_transitions. One row per requested run in input order: outcome completed | retry_scheduled | failed | dead_lettered | cancelled | handed_back | timed_out | run_timed_out, NULL when refused, and sqlstate NULL when settled, else the SQLSTATE of the refusal, reported not raised (lease_lost: fenced out; transition_not_listed: no such edge from the run''s status); a refused row never stops the others. Locks slots then runs, each in run_id order. Raises ZP008 (nothing changed). Notifies zeroth_wakeup once per deployment when slots were freed, a retry is due now or a run was handed back. Time: clock_timestamp().';
ALTER FUNCTION zeroth.settle_runs(text, uuid[], bigint[], text[], jsonb[], jsonb[], double precision, double precision, text, text) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth.settle_runs(text, uuid[], bigint[], text[], jsonb[], jsonb[], double precision, double precision, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION zeroth.settle_runs(text, uuid[], bigint[], text[], jsonb[], jsonb[], double precision, double precision, text, text) TO zeroth_worker;
