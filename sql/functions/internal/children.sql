-- sql/functions/internal/children.sql: what start_child_run, wait_for_children, wake_due_waits and
-- the child triggers share.
-- Internal helpers: SECURITY INVOKER, executable by zeroth_owner only (they run inside the
-- SECURITY DEFINER public functions and the triggers on zeroth.runs). Re-applied by every upgrade
-- (sql/README.md).
--
-- Lock order (sql/README.md): a parent's own calls lock the parent (slot, run row), then the
-- child_runs rows they read (FOR SHARE); a cancelled parent's trigger then locks its unfinished
-- children (slot, run row: zeroth._cancel) and their child_runs rows, never a child_waits row. A
-- child that ends holds its own slot and row, then its child_runs row, then (only while its parent
-- is waiting for children) the parent's child_waits rows, and takes the parent's run row only with
-- SKIP LOCKED: it never waits for the parent, so it cannot close a cycle with the parent's cancel,
-- which waits for the child. Left: two transactions that each end children of the same two
-- waiting parents (two workers' complete_runs batches of siblings) can take the two parents'
-- child_waits rows in opposite orders; PostgreSQL breaks that after deadlock_timeout and the
-- worker repeats its batch (40P01 is retryable). A wake-up skipped that way (the parent's row was held by another
-- session that left it waiting) marks the wait (child_waits.met_at) and is made by
-- zeroth.wake_due_waits.

-- How many of the listed children of the parent have ended, read from the copies of their
-- outcomes in child_runs (a wait for all is met at cardinality, a wait for any at 1).
CREATE OR REPLACE FUNCTION zeroth._children_ended(tenant_id text, workspace_key text, parent_run_id uuid,
                                                  child_run_ids uuid[])
    RETURNS integer
    -- (PL/pgSQL for the reason zeroth._notify gives: wait_for_children and the reopen trigger
    -- count here.)
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT count(c.status)::integer
              FROM zeroth.child_runs c
             WHERE c.tenant_id = _children_ended.tenant_id
               AND c.workspace_key = _children_ended.workspace_key
               AND c.parent_run_id = _children_ended.parent_run_id
               AND c.child_run_id = ANY (_children_ended.child_run_ids));
END
$$;
COMMENT ON FUNCTION zeroth._children_ended(text, text, uuid, uuid[]) IS 'Internal: how many of the listed children of the parent have ended, by their outcomes in child_runs.';
ALTER FUNCTION zeroth._children_ended(text, text, uuid, uuid[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._children_ended(text, text, uuid, uuid[]) FROM PUBLIC;

-- The outcomes of the children, in the order given: one JSON object each (run_id, status, output,
-- error, dead_lettered, finished_at); status NULL for a child that has not ended.
CREATE OR REPLACE FUNCTION zeroth._child_outcomes(tenant_id text, workspace_key text, parent_run_id uuid,
                                                  child_run_ids uuid[])
    RETURNS jsonb
    -- (PL/pgSQL for the reason zeroth._notify gives.)
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'run_id', c.child_run_id, 'status', c.status, 'output', c.output, 'error', c.error,
                       'dead_lettered', c.dead_lettered, 'finished_at', c.finished_at) ORDER BY u.ord),
                       '[]'::jsonb)
              FROM unnest(_child_outcomes.child_run_ids) WITH ORDINALITY AS u(child_run_id, ord)
              JOIN zeroth.child_runs c
                ON c.tenant_id = _child_outcomes.tenant_id
               AND c.workspace_key = _child_outcomes.workspace_key
               AND c.parent_run_id = _child_outcomes.parent_run_id
               AND c.child_run_id = u.child_run_id);
END
$$;
COMMENT ON FUNCTION zeroth._child_outcomes(text, text, uuid, uuid[]) IS 'Internal: the outcomes of the children in the order given (run_id, status, output, error, dead_lettered, finished_at; status NULL while a child has not ended), as a JSON array.';
ALTER FUNCTION zeroth._child_outcomes(text, text, uuid, uuid[]) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._child_outcomes(text, text, uuid, uuid[]) FROM PUBLIC;

-- A child run ended → copy its outcome to its child_runs row and, on its first end since it was
-- started or last reopened (zeroth._child_run_reopened clears the copy and recounts), count it
-- down in each of its parent's waits that lists it; a wait whose count says it is met (all: none
-- left; any: one fewer than listed) makes the parent pending. O(1) rows per end, whatever the
-- number of siblings: the count, not the siblings, decides. The parent's child_waits rows are
-- locked (they serialise siblings that end at once); the parent's row is taken SKIP LOCKED (see
-- the lock order above), and a wake-up skipped that way marks the wait (met_at). Called by the
-- triggers of a child's end (its update) and of its deletion before it ended (reported as
-- cancelled), with the ending call's time.
CREATE OR REPLACE FUNCTION zeroth._child_ended(
    tenant_id text, workspace_key text, parent_run_id uuid, child_run_id uuid,
    status zeroth.run_status, output jsonb, error jsonb, dead_lettered boolean, at timestamptz)
    RETURNS void
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_was   zeroth.run_status;
    v_wait  record;
    v_left  integer;
    v_run   record;
BEGIN
    SELECT c.status INTO v_was FROM zeroth.child_runs c
     WHERE c.tenant_id = _child_ended.tenant_id
       AND c.workspace_key = _child_ended.workspace_key
       AND c.child_run_id = _child_ended.child_run_id
       AND c.parent_run_id = _child_ended.parent_run_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the parent (and with it the link) was pruned
    END IF;
    UPDATE zeroth.child_runs c
       SET status = _child_ended.status, output = _child_ended.output, error = _child_ended.error,
           dead_lettered = _child_ended.dead_lettered, finished_at = _child_ended.at
     WHERE c.tenant_id = _child_ended.tenant_id
       AND c.workspace_key = _child_ended.workspace_key
       AND c.child_run_id = _child_ended.child_run_id
       AND c.parent_run_id = _child_ended.parent_run_id;
    IF v_was IS NOT NULL THEN
        RETURN;  -- already ended (a DBA's update between two ends): every wait counted it then
    END IF;
    -- Only a parent waiting for children has a wait to count down. A plain read, after the
    -- update above: a parent entering its wait right now holds this child's child_runs row FOR
    -- SHARE, so the update waited for it and this read sees the parent waiting (and a wait that
    -- waited for us counts this end itself). Inside a parent's cancel the parent reads as
    -- cancelled, so a cancel cascade never takes a child_waits row: a sibling's end holding one
    -- while the cancel waits for the sibling's run row cannot close a cycle. A wait skipped here
    -- is recounted by the parent's next wait_for_children (its ON CONFLICT branch).
    PERFORM 1 FROM zeroth.runs p
     WHERE p.tenant_id = _child_ended.tenant_id
       AND p.workspace_key = _child_ended.workspace_key
       AND p.run_id = _child_ended.parent_run_id
       AND p.status = 'waiting'
       AND p.wait_reason LIKE 'children:%';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    FOR v_wait IN
        SELECT w.step_key, w.mode, cardinality(w.child_run_ids) AS listed FROM zeroth.child_waits w
         WHERE w.tenant_id = _child_ended.tenant_id
           AND w.workspace_key = _child_ended.workspace_key
           AND w.parent_run_id = _child_ended.parent_run_id
           AND _child_ended.child_run_id = ANY (w.child_run_ids)
         ORDER BY w.step_key
           FOR UPDATE
    LOOP
        UPDATE zeroth.child_waits w SET remaining = greatest(w.remaining - 1, 0)
         WHERE w.tenant_id = _child_ended.tenant_id AND w.workspace_key = _child_ended.workspace_key
           AND w.parent_run_id = _child_ended.parent_run_id AND w.step_key = v_wait.step_key
        RETURNING w.remaining INTO v_left;
        CONTINUE WHEN NOT (v_left = 0 OR (v_wait.mode = 'any' AND v_left < v_wait.listed));
        UPDATE zeroth.runs r
           SET status = 'pending', wait_reason = NULL, run_after = _child_ended.at, updated_at = _child_ended.at
         WHERE r.tenant_id = _child_ended.tenant_id
           AND r.workspace_key = _child_ended.workspace_key
           AND r.run_id = (SELECT p.run_id FROM zeroth.runs p
                            WHERE p.tenant_id = _child_ended.tenant_id
                              AND p.workspace_key = _child_ended.workspace_key
                              AND p.run_id = _child_ended.parent_run_id
                              AND p.status = 'waiting'
                              AND p.wait_reason = 'children:' || v_wait.step_key
                              AND p.thread_queued_at IS NULL
                              FOR NO KEY UPDATE SKIP LOCKED)
           AND r.status = 'waiting'
        RETURNING r.deployment_ref, r.workspace_id INTO v_run;
        IF FOUND THEN
            PERFORM zeroth._notify_wakeup(v_run.deployment_ref, _child_ended.tenant_id, v_run.workspace_id);
        ELSE
            -- Not woken (its row was locked, or it is not waiting on this key now): marked,
            -- so wake_due_waits visits this wait and no other.
            UPDATE zeroth.child_waits w SET met_at = coalesce(w.met_at, _child_ended.at)
             WHERE w.tenant_id = _child_ended.tenant_id AND w.workspace_key = _child_ended.workspace_key
               AND w.parent_run_id = _child_ended.parent_run_id AND w.step_key = v_wait.step_key;
        END IF;
    END LOOP;
END
$$;
COMMENT ON FUNCTION zeroth._child_ended(text, text, uuid, uuid, zeroth.run_status, jsonb, jsonb, boolean, timestamptz) IS 'Internal: a child run ended (or was deleted before it ended) → copy its outcome to child_runs; on its first end since it was started or reopened, count it down in its parent''s waits; a wait now met (all: none left; any: one ended) makes the waiting parent pending, due now (parent row taken SKIP LOCKED; a skipped wake-up marks child_waits.met_at and wake_due_waits makes it). NOTIFY zeroth_wakeup when a parent was woken.';
ALTER FUNCTION zeroth._child_ended(text, text, uuid, uuid, zeroth.run_status, jsonb, jsonb, boolean, timestamptz) OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._child_ended(text, text, uuid, uuid, zeroth.run_status, jsonb, jsonb, boolean, timestamptz) FROM PUBLIC;

-- Trigger runs_child_run_finished: a child run ended (any function, any path, a DBA's update).
CREATE OR REPLACE FUNCTION zeroth._child_run_finished() RETURNS trigger
    -- Pinned: a trigger runs with the search_path of whoever updates the row.
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._child_ended(NEW.tenant_id, NEW.workspace_key, NEW.parent_run_id, NEW.run_id,
                                NEW.status, NEW.output, NEW.error, NEW.dead_lettered_at IS NOT NULL,
                                coalesce(NEW.finished_at, NEW.updated_at));
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._child_run_finished() IS 'Internal trigger (runs_child_run_finished): a child run ended → zeroth._child_ended with its outcome and time.';
ALTER FUNCTION zeroth._child_run_finished() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._child_run_finished() FROM PUBLIC;

-- Trigger runs_child_run_deleted: a child run deleted before it ended (a DBA's DELETE; prune_runs
-- deletes only ended runs) is an end its parent sees — cancelled, with an error saying why —
-- not a child the parent waits for forever.
CREATE OR REPLACE FUNCTION zeroth._child_run_deleted() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM zeroth._child_ended(OLD.tenant_id, OLD.workspace_key, OLD.parent_run_id, OLD.run_id,
                                'cancelled', NULL,
                                jsonb_build_object('message', 'the child run was deleted before it ended',
                                                   'deleted_status', OLD.status),
                                false, zeroth._now());
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._child_run_deleted() IS 'Internal trigger (runs_child_run_deleted): a child run deleted before it ended → zeroth._child_ended as cancelled, error {message, deleted_status}, so its parent is not left waiting.';
ALTER FUNCTION zeroth._child_run_deleted() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._child_run_deleted() FROM PUBLIC;

-- Trigger runs_child_run_reopened: a child that had ended is active again (redrive_run, a DBA) →
-- its outcome copy is cleared, so a wait made from now on waits for its next end, and, while its
-- parent waits for children, each of the parent's waits that lists it and has no recorded result
-- yet is recounted (remaining from the copies; met_at cleared when no longer met). A parent that
-- is not waiting recounts its wait when it next enters one (wait_for_children's ON CONFLICT
-- branch), and only waiting parents are woken, so its wait rows are left alone. A wait whose
-- result was recorded keeps it: a step's result is written once. Locks as a child's end: the
-- child's child_runs row, then (only while the parent waits for children) the parent's
-- child_waits rows in step_key order.
CREATE OR REPLACE FUNCTION zeroth._child_run_reopened() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_wait record;
    v_left integer;
BEGIN
    UPDATE zeroth.child_runs c
       SET status = NULL, output = NULL, error = NULL, dead_lettered = false, finished_at = NULL
     WHERE c.tenant_id = NEW.tenant_id
       AND c.workspace_key = NEW.workspace_key
       AND c.child_run_id = NEW.run_id
       AND c.parent_run_id = NEW.parent_run_id
       AND c.status IS NOT NULL;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Only a parent waiting for children has a wait to recount; a plain read after the update
    -- above, as in zeroth._child_ended (a parent entering its wait right now holds this child's
    -- child_runs row FOR SHARE: the update waited for it, and this read sees it waiting). Taking
    -- no child_waits row otherwise keeps a redrive of an ended parent's child from deadlocking
    -- with prune_runs, which deletes that parent's wait rows and then, ON DELETE CASCADE, this
    -- child's child_runs row.
    PERFORM 1 FROM zeroth.runs p
     WHERE p.tenant_id = NEW.tenant_id
       AND p.workspace_key = NEW.workspace_key
       AND p.run_id = NEW.parent_run_id
       AND p.status = 'waiting'
       AND p.wait_reason LIKE 'children:%';
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    FOR v_wait IN
        SELECT w.step_key, w.mode, w.child_run_ids FROM zeroth.child_waits w
         WHERE w.tenant_id = NEW.tenant_id
           AND w.workspace_key = NEW.workspace_key
           AND w.parent_run_id = NEW.parent_run_id
           AND NEW.run_id = ANY (w.child_run_ids)
         ORDER BY w.step_key
           FOR UPDATE
    LOOP
        v_left := cardinality(v_wait.child_run_ids)
                  - zeroth._children_ended(NEW.tenant_id, NEW.workspace_key, NEW.parent_run_id,
                                           v_wait.child_run_ids);
        UPDATE zeroth.child_waits w
           SET remaining = v_left,
               met_at = CASE WHEN v_left = 0
                               OR (v_wait.mode = 'any' AND v_left < cardinality(v_wait.child_run_ids))
                             THEN w.met_at END
         WHERE w.tenant_id = NEW.tenant_id AND w.workspace_key = NEW.workspace_key
           AND w.parent_run_id = NEW.parent_run_id AND w.step_key = v_wait.step_key;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._child_run_reopened() IS 'Internal trigger (runs_child_run_reopened): an ended child run is active again (redrive_run, a DBA) → clear its outcome copy in child_runs and, while its parent waits for children, recount the parent''s unrecorded waits that list it (remaining; met_at cleared when no longer met; a parent not waiting recounts when it next waits). Recorded step results are kept.';
ALTER FUNCTION zeroth._child_run_reopened() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._child_run_reopened() FROM PUBLIC;

-- A run was cancelled (any function, any path) → cancel its unfinished descendants that were not
-- started detached, each as request_cancel would with no grace (zeroth._cancel: pending or waiting
-- → cancelled; running with a live lease → cancel requested, owner notified; running past its
-- lease → cancelled). A cancelled child's own children follow the same way; those of a child
-- that is only asked to cancel wait for its end (its cancel_run fires this trigger again).
-- Iterative, one generation per pass: the trigger that fires for the run cancelled first walks
-- the whole tree, parents before children (so a parent reads as cancelled before its children
-- end: the lock order above), and the trigger firing for each descendant it
-- cancels returns at once, recognised by the transaction-local mark zeroth.cancel_cascade that
-- the walk raises around itself and by its trigger depth (a mark set by a caller at depth 1 is
-- ignored). The stack stays two triggers deep however deep the tree: a 1,000-generation chain
-- is cancelled in one call. A run with no children pays one index probe on child_runs.
CREATE OR REPLACE FUNCTION zeroth._cancel_children() RETURNS trigger
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_parents uuid[] := ARRAY[NEW.run_id];
    v_next    uuid[];
    v_child   uuid;
    v_mark    text;
BEGIN
    IF pg_trigger_depth() > 1
       AND coalesce(current_setting('zeroth.cancel_cascade', true), '') = 'on' THEN
        RETURN NULL;  -- a descendant cancelled by the walk below: the walk visits its children
    END IF;
    v_mark := coalesce(current_setting('zeroth.cancel_cascade', true), '');
    LOOP
        v_next := '{}';
        FOR v_child IN
            SELECT c.child_run_id FROM zeroth.child_runs c
             WHERE c.tenant_id = NEW.tenant_id
               AND c.workspace_key = NEW.workspace_key
               AND c.parent_run_id = ANY (v_parents)
               AND c.status IS NULL
               AND NOT c.detached
             ORDER BY c.child_run_id
        LOOP
            PERFORM set_config('zeroth.cancel_cascade', 'on', true);
            -- A child whose cancel the state machine refuses (ZP003: an edge a DBA removed from
            -- zeroth.run_transitions) is left as it is, with a WARNING: the refusal is the
            -- child's, and must not undo its parent's end (nor, in settle_runs, the other runs of
            -- the batch). A subtransaction per child: cancels are off the hot path.
            BEGIN
                IF (zeroth._cancel(NEW.tenant_id, NEW.workspace_key, v_child, 'cancel', interval '0',
                                   NEW.updated_at)).outcome IN ('cancelled', 'taken_over') THEN
                    v_next := v_next || v_child;
                END IF;
            EXCEPTION WHEN SQLSTATE 'ZP003' THEN
                RAISE WARNING 'zeroth: child run % of cancelled run % was not cancelled: %',
                    v_child, NEW.run_id, SQLERRM;
            END;
            PERFORM set_config('zeroth.cancel_cascade', v_mark, true);
        END LOOP;
        EXIT WHEN cardinality(v_next) = 0;
        v_parents := v_next;
    END LOOP;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION zeroth._cancel_children() IS 'Internal trigger: a run was cancelled → cancel its unfinished, non-detached descendants as request_cancel does (zeroth._cancel, no grace), one generation at a time, parents first, each generation in run_id order; a child only asked to cancel (live lease) keeps its children until its own end. Iterative: the triggers of the descendants it cancels return at once (mark zeroth.cancel_cascade, trigger depth), so any depth of tree is cancelled in one call.';
ALTER FUNCTION zeroth._cancel_children() OWNER TO zeroth_owner;
REVOKE ALL ON FUNCTION zeroth._cancel_children() FROM PUBLIC;
