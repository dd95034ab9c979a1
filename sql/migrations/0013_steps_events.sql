-- 0013_steps_events: durable steps and external events (issue 16, parts 1 and 2).
--
--   * zeroth.run_steps: one recorded result per (run, step key), written once by the live lease
--     holder (zeroth.record_step, zeroth.wait_for_event); the first recorded result wins and a
--     stale holder records nothing. Deleted with its run (ON DELETE CASCADE: prune_runs).
--   * zeroth.events: the events of a scope by name. A row with emitted_at NULL is a channel a run
--     waits on (its row lock serialises a wait against an emit: no lost wake-up); emit_event
--     fills payload and emitted_at once (first write wins).
--   * zeroth.event_waits: which run waits on which event of its scope, under which step key, until
--     when (timeout_at). Kept until the wait's step result is recorded, so a replay after a
--     wake-up (event, timeout, resume_run) finds the same deadline. Deleted with its run.
-- No role but zeroth_owner reads these tables: the functions are the interface.

CREATE TABLE zeroth.run_steps (
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    run_id           uuid        NOT NULL,
    step_key         text        NOT NULL,
    result           jsonb       NOT NULL,
    lease_generation bigint      NOT NULL,
    attempt          integer     NOT NULL,
    recorded_at      timestamptz NOT NULL,
    CONSTRAINT run_steps_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, step_key),
    CONSTRAINT run_steps_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE,
    CONSTRAINT run_steps_step_key_valid CHECK (step_key <> '' AND length(step_key) <= 400)
);
COMMENT ON TABLE zeroth.run_steps IS 'Recorded step results per run (run.step, wait_for_event): written once per (run, step_key) by the live lease holder (record_step, wait_for_event); first recorded result wins. lease_generation and attempt say which attempt recorded it. Deleted with the run.';
ALTER TABLE zeroth.run_steps OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_steps ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.run_steps FROM PUBLIC;

CREATE TABLE zeroth.events (
    tenant_id     text        NOT NULL,
    workspace_key text        NOT NULL,
    name          text        NOT NULL,
    payload       jsonb,
    emitted_at    timestamptz,
    created_at    timestamptz NOT NULL,
    CONSTRAINT events_pkey PRIMARY KEY (tenant_id, workspace_key, name),
    CONSTRAINT events_name_valid CHECK (name <> '' AND length(name) <= 200),
    CONSTRAINT events_emitted CHECK ((payload IS NULL) = (emitted_at IS NULL))
);
COMMENT ON TABLE zeroth.events IS 'External events of a scope by name (emit_event): payload and emitted_at are written once (first write wins). A row with emitted_at NULL is a channel a run waits on; its row lock serialises wait_for_event against emit_event.';
ALTER TABLE zeroth.events OWNER TO zeroth_owner;
ALTER TABLE zeroth.events ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.events FROM PUBLIC;

CREATE TABLE zeroth.event_waits (
    tenant_id     text        NOT NULL,
    workspace_key text        NOT NULL,
    run_id        uuid        NOT NULL,
    step_key      text        NOT NULL,
    name          text        NOT NULL,
    timeout_at    timestamptz,
    created_at    timestamptz NOT NULL,
    CONSTRAINT event_waits_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, step_key),
    CONSTRAINT event_waits_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE
);
COMMENT ON TABLE zeroth.event_waits IS 'A run waiting on an event of its scope (wait_for_event): the step key its result will be recorded under and the database time it times out (NULL: never). Kept until that result is recorded; deleted with the run.';
ALTER TABLE zeroth.event_waits OWNER TO zeroth_owner;
ALTER TABLE zeroth.event_waits ENABLE ROW LEVEL SECURITY;  -- no policy: nobody but the owner
REVOKE ALL ON zeroth.event_waits FROM PUBLIC;
CREATE INDEX event_waits_name_idx ON zeroth.event_waits (tenant_id, workspace_key, name);
CREATE INDEX event_waits_timeout_idx ON zeroth.event_waits (timeout_at) WHERE timeout_at IS NOT NULL;
