-- 0014_child_runs: child runs (issue 16, part 3).
--
--   * zeroth.runs.parent_run_id: the run (same scope) that started this one with start_child_run;
--     NULL for every other run. The trigger that reports a child's end to its parent is guarded by
--     it (WHEN NEW.parent_run_id IS NOT NULL), so a run that is no child pays one NULL test.
--     Nullable without a default: adding it rewrites nothing.
--   * zeroth.child_runs: one row per (parent, step key) → child, written once by the parent's live
--     lease holder (start_child_run; a replay gets the same child back). The child's outcome
--     (status, output, error, dead-lettered) is copied here when it ends, so the parent's wait
--     does not depend on the child's row (which prune_runs may delete first). Deleted with the
--     parent.
--   * zeroth.child_waits: the parent waiting for some of its children (all or any) under a step
--     key, and how many of them are still to end (remaining: counted down by each child's first
--     end, so a child's end costs O(1) rows however many siblings it has; the wait is met at 0
--     for all, below the number listed for any). Its row lock serialises the children that end
--     at once; kept until the wait's step result is recorded. met_at
--     marks a wait that was met when the child's end could not wake the parent (its row was
--     locked): wake_due_waits visits only those (partial index), so its sweep costs nothing
--     while no wake-up was skipped. Deleted with the parent by prune_runs (no foreign key: see
--     the table).
-- No role but zeroth_owner reads the two tables: the functions are the interface.

ALTER TABLE zeroth.runs ADD COLUMN parent_run_id uuid;
COMMENT ON COLUMN zeroth.runs.parent_run_id IS 'The run of the same scope that started this one as a child run (start_child_run); NULL otherwise.';

CREATE TABLE zeroth.child_runs (
    tenant_id       text              NOT NULL,
    workspace_key   text              NOT NULL,
    parent_run_id   uuid              NOT NULL,
    step_key        text              NOT NULL,
    child_run_id    uuid              NOT NULL,
    deployment_ref  text              NOT NULL,
    payload         jsonb             NOT NULL,
    detached        boolean           NOT NULL,
    created_at      timestamptz       NOT NULL,
    status          zeroth.run_status,
    output          jsonb,
    error           jsonb,
    dead_lettered   boolean           NOT NULL DEFAULT false,
    finished_at     timestamptz,
    CONSTRAINT child_runs_pkey PRIMARY KEY (tenant_id, workspace_key, parent_run_id, step_key),
    CONSTRAINT child_runs_child_key UNIQUE (tenant_id, workspace_key, child_run_id),
    CONSTRAINT child_runs_parent_fkey FOREIGN KEY (tenant_id, workspace_key, parent_run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE,
    CONSTRAINT child_runs_step_key_valid CHECK (step_key <> '' AND length(step_key) <= 400),
    CONSTRAINT child_runs_outcome_terminal CHECK (status IS NULL OR status IN ('completed', 'failed', 'cancelled')),
    CONSTRAINT child_runs_outcome_complete CHECK ((status IS NULL) = (finished_at IS NULL))
);
COMMENT ON TABLE zeroth.child_runs IS 'Child runs per parent and step key (start_child_run): written once by the parent''s live lease holder; the child''s terminal outcome (status, output, error, dead_lettered, finished_at) is copied in when it ends (trigger runs_child_run_finished). Deleted with the parent.';
ALTER TABLE zeroth.child_runs OWNER TO zeroth_owner;
ALTER TABLE zeroth.child_runs ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.child_runs FROM PUBLIC;

CREATE TABLE zeroth.child_waits (
    tenant_id     text        NOT NULL,
    workspace_key text        NOT NULL,
    parent_run_id uuid        NOT NULL,
    step_key      text        NOT NULL,
    mode          text        NOT NULL,
    child_run_ids uuid[]      NOT NULL,
    remaining     integer     NOT NULL,
    created_at    timestamptz NOT NULL,
    met_at        timestamptz,
    -- No foreign key to runs: siblings ending in one transaction (a complete_runs batch) update
    -- this row more than once, and PostgreSQL re-checks a foreign key when the row it updates was
    -- written by its own transaction, taking FOR KEY SHARE on the parent's row: that would wait
    -- for (and could deadlock with) the parent's cancel, which holds the parent and waits for the
    -- children. prune_runs deletes a parent's waits instead of ON DELETE CASCADE.
    CONSTRAINT child_waits_pkey PRIMARY KEY (tenant_id, workspace_key, parent_run_id, step_key),
    CONSTRAINT child_waits_mode_valid CHECK (mode IN ('all', 'any')),
    CONSTRAINT child_waits_children_nonempty CHECK (cardinality(child_run_ids) >= 1),
    CONSTRAINT child_waits_remaining_valid CHECK (remaining BETWEEN 0 AND cardinality(child_run_ids))
);
COMMENT ON TABLE zeroth.child_waits IS 'A parent run waiting for its children (wait_for_children): the step key its result will be recorded under, the mode (all | any), the children awaited and how many are still to end (remaining); met_at once the wait was met while the parent''s row was locked (wake_due_waits wakes it). Kept until that result is recorded; deleted with the parent (prune_runs).';
CREATE INDEX child_waits_met ON zeroth.child_waits (met_at) WHERE met_at IS NOT NULL;
ALTER TABLE zeroth.child_waits OWNER TO zeroth_owner;
ALTER TABLE zeroth.child_waits ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.child_waits FROM PUBLIC;
