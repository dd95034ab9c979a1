-- 0021_streams_timeouts_versions: state changes for the work of the session of 2026-12-05
-- (night): a run event stream, attempt and run timeouts, and code versions (issue 34), the
-- settle path's last lease resets and the per-run cost of the hot path (issues 33, 30), and the
-- test suite (issue 32).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: settle path and per-run cost (issues 33, 30) =====
--
--
--

-- ===== section: run event stream (issue 34, item 1) =====
--
-- zeroth.run_events: a run's event stream (append_run_event, read_run_events). Numbered per run
-- 1, 2, 3… under the run's row lock (no gap a reader could skip); kind 'end' is the END that
-- zeroth._settle writes when a run that has events ends. Deleted with the run (ON DELETE CASCADE,
-- as run_steps: prune_runs and a DBA's DELETE). zeroth_reader reads its tenant's rows.
CREATE TABLE zeroth.run_events (
    tenant_id        text        NOT NULL,
    workspace_key    text        NOT NULL,
    run_id           uuid        NOT NULL,
    event_id         bigint      NOT NULL,
    kind             text        NOT NULL,
    name             text        NOT NULL,
    data             jsonb       NOT NULL,
    lease_generation bigint      NOT NULL,
    created_at       timestamptz NOT NULL,
    CONSTRAINT run_events_pkey PRIMARY KEY (tenant_id, workspace_key, run_id, event_id),
    CONSTRAINT run_events_run_fkey FOREIGN KEY (tenant_id, workspace_key, run_id)
        REFERENCES zeroth.runs (tenant_id, workspace_key, run_id) ON DELETE CASCADE,
    CONSTRAINT run_events_event_id_valid CHECK (event_id >= 1),
    CONSTRAINT run_events_kind_valid CHECK (kind IN ('event', 'end')),
    CONSTRAINT run_events_name_valid CHECK (name <> '' AND length(name) <= 200)
);
COMMENT ON TABLE zeroth.run_events IS 'A run''s event stream: events numbered 1, 2, 3… per run in commit order (append_run_event, by the live lease holder of a running run, under the run''s row lock), each with its name, a bounded JSON payload, the lease generation that wrote it and the database time; kind ''end'' is the END written by the settle path (zeroth._settle) when a run that has events ends. read_run_events reads it (and says END for a run ended with no END row). Deleted with the run. zeroth_reader reads the rows of the tenant named in zeroth.tenant_id.';
COMMENT ON COLUMN zeroth.run_events.kind IS 'event (append_run_event) | end (the run ended: data holds its status and outcome).';
ALTER TABLE zeroth.run_events OWNER TO zeroth_owner;
ALTER TABLE zeroth.run_events ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.run_events FROM PUBLIC;
CREATE POLICY run_events_reader_tenant ON zeroth.run_events FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY run_events_reader_tenant ON zeroth.run_events IS 'zeroth_reader sees the run events of the tenant named in the setting zeroth.tenant_id (none when unset).';
GRANT SELECT ON zeroth.run_events TO zeroth_reader;

-- ===== section: attempt and run timeouts (issue 34, item 2) =====
--
--
--

-- ===== section: code versions (issue 34, item 3) =====
--
--
--

-- ===== section: test suite (issue 32) =====
--
--
--
