-- 0015_dashboard_views: what the dashboard (zeroth-pg web, issue 17) needs from the tables, so
-- it reads only through views (sql/functions/views/run_list.sql and its neighbours).
--
--   * runs_created_idx: the runs page pages by keyset on (created_at, run_id), newest first,
--     with or without filters; without this index every page sorts the whole table. created_at
--     is written once at insert and never updated, so lease renewals and status changes stay
--     as HOT as before; the cost is one more btree insert per enqueue, at the right edge of the
--     index (created_at grows), measured in docs/performance.md.
--   * runs_run_id_idx: the run page and the runs page's search find a run by run_id alone
--     (runs_pkey leads with tenant_id, workspace_key, and PostgreSQL 15 has no skip scan).
--   * zeroth_reader may read run_steps, event_waits and events, filtered to its tenant like
--     runs and checkpoints (0006): the run page shows a run's steps and event waits to a
--     reader DSN through the views step_list and wait_list, which read as their caller.

CREATE INDEX runs_created_idx ON zeroth.runs (created_at, run_id);
COMMENT ON INDEX zeroth.runs_created_idx IS 'Keyset pages of runs by (created_at, run_id), newest first (zeroth.run_list, the dashboard''s runs page).';
CREATE INDEX runs_run_id_idx ON zeroth.runs (run_id);
COMMENT ON INDEX zeroth.runs_run_id_idx IS 'A run by its id alone, whatever its scope (zeroth.run_list, the dashboard''s run page and search).';

GRANT SELECT ON zeroth.run_steps, zeroth.event_waits, zeroth.events TO zeroth_reader;
CREATE POLICY run_steps_reader_tenant ON zeroth.run_steps FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY run_steps_reader_tenant ON zeroth.run_steps IS 'zeroth_reader sees the step results of the tenant named in the setting zeroth.tenant_id (none when unset).';
CREATE POLICY event_waits_reader_tenant ON zeroth.event_waits FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY event_waits_reader_tenant ON zeroth.event_waits IS 'zeroth_reader sees the event waits of the tenant named in the setting zeroth.tenant_id (none when unset).';
CREATE POLICY events_reader_tenant ON zeroth.events FOR SELECT TO zeroth_reader
    USING (tenant_id = current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY events_reader_tenant ON zeroth.events IS 'zeroth_reader sees the events of the tenant named in the setting zeroth.tenant_id (none when unset).';
