-- 0006_security: roles, ownership, grants, SECURITY DEFINER with a pinned search_path, and
-- row-level security for readers.
--
-- Who may run it: a superuser (the tests and the embedded server), or a role that has CREATEROLE
-- (only while the three roles do not exist yet) and can SET ROLE zeroth_owner (ALTER ... OWNER TO
-- needs it; ALTER SCHEMA also needs CREATE on the database for zeroth_owner). Every later
-- migration runs as such a role too (docs/security.md).
--
-- The model (sql/README.md "Roles and grants", docs/security.md):
--   * zeroth_owner  NOLOGIN, owns the schema and every object in it. The public functions are
--                   SECURITY DEFINER, so they run as zeroth_owner whoever calls them, with
--                   search_path pinned to pg_catalog, pg_temp (CVE-2018-1058: a caller's
--                   search_path can never substitute a function or an operator inside them).
--   * zeroth_worker NOLOGIN, EXECUTE on the worker and producer functions only; no table, view
--                   or sequence privilege, so every write goes through a fenced function.
--   * zeroth_reader NOLOGIN, SELECT on the operator views and on runs/checkpoints, filtered by
--                   row-level security to the tenant named in the setting zeroth.tenant_id.
--   Nothing in the schema is executable or readable by PUBLIC. Grant a LOGIN role membership:
--   GRANT zeroth_worker TO app_worker;
--
-- Roles are cluster-wide: they are created only when missing, so this file also runs on a fresh
-- database of a cluster where another database already ran it.

DO $roles$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['zeroth_owner', 'zeroth_worker', 'zeroth_reader'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = v_role) THEN
            BEGIN
                EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database of the cluster created it at the same moment
            END;
        END IF;
    END LOOP;
END
$roles$;

-- ---------------------------------------------------------------------------------------------
-- Ownership: everything in schema zeroth belongs to zeroth_owner (indexes and row types follow
-- their tables). A catalog loop, so no object can be forgotten; tests/security checks the result.
-- ---------------------------------------------------------------------------------------------

ALTER SCHEMA zeroth OWNER TO zeroth_owner;

DO $owner$
DECLARE
    v_statement text;
BEGIN
    FOR v_statement IN
        SELECT pg_catalog.format('ALTER %s %s OWNER TO zeroth_owner',
                                 CASE c.relkind WHEN 'v' THEN 'VIEW'
                                                WHEN 'm' THEN 'MATERIALIZED VIEW'
                                                WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
                                 c.oid::pg_catalog.regclass)
          FROM pg_catalog.pg_class c
         WHERE c.relnamespace = 'zeroth'::pg_catalog.regnamespace
           AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d  -- identity/serial sequences follow
                            WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                              AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
        UNION ALL
        SELECT pg_catalog.format('ALTER TYPE %s OWNER TO zeroth_owner', t.oid::pg_catalog.regtype)
          FROM pg_catalog.pg_type t
          LEFT JOIN pg_catalog.pg_class c ON c.oid = t.typrelid
         WHERE t.typnamespace = 'zeroth'::pg_catalog.regnamespace
           AND (t.typtype IN ('e', 'd', 'r') OR c.relkind = 'c')  -- arrays follow their element
        UNION ALL
        SELECT pg_catalog.format('ALTER ROUTINE %s OWNER TO zeroth_owner',
                                 p.oid::pg_catalog.regprocedure)
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'zeroth'::pg_catalog.regnamespace
    LOOP
        EXECUTE v_statement;
    END LOOP;
END
$owner$;

-- ---------------------------------------------------------------------------------------------
-- Public functions run as zeroth_owner with a pinned search_path. Listed one by one so a review
-- sees each; tests/security fails when a public function is missing here (or in a later file).
-- A later CREATE OR REPLACE resets both attributes: it must repeat them (sql/README.md).
-- ---------------------------------------------------------------------------------------------

ALTER FUNCTION zeroth.enqueue_run                SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.enqueue_runs               SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.admit_run                  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.claim_pending              SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.claim_orphaned             SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.claim_for_takeover         SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.reconcile_thread_runs      SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.renew_lease                SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.renew_leases               SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.current_generation         SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.current_holder             SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.get_recovery_checkpoint_id SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.count_pending              SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.list_thread_runs           SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.get_thread_run             SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.commit_fenced              SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.update_run_progress        SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.start_run                  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.save_checkpoint            SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.complete_run               SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.fail_run                   SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.cancel_run                 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.pause_run                  SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.release_lease              SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.hand_back_to_pending       SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.expire_recovery_lease      SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.request_cancel             SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.request_cancel_v2          SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.resume_run                 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.clear_lease                SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.redrive_run                SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION zeroth.prune_runs                 SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------------------------
-- Privileges. PUBLIC gets nothing; helpers (_-prefixed) are executable by zeroth_owner only,
-- which is who runs them (from inside the SECURITY DEFINER functions).
-- ---------------------------------------------------------------------------------------------

REVOKE ALL ON SCHEMA zeroth FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA zeroth FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA zeroth FROM PUBLIC;
-- Functions zeroth_owner creates later start without PUBLIC EXECUTE. (Functions a migrating role
-- creates are its own until the migration hands them over; the tests catch one left PUBLIC.)
ALTER DEFAULT PRIVILEGES FOR ROLE zeroth_owner REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

GRANT USAGE ON SCHEMA zeroth TO zeroth_worker, zeroth_reader;

-- Worker and producer functions. Not granted (admin only, run as zeroth_owner or a superuser):
-- clear_lease (unfenced), redrive_run (undoes a dead letter), prune_runs (deletes history).
GRANT EXECUTE ON FUNCTION
    zeroth.enqueue_run,
    zeroth.enqueue_runs,
    zeroth.admit_run,
    zeroth.claim_pending,
    zeroth.claim_orphaned,
    zeroth.claim_for_takeover,
    zeroth.reconcile_thread_runs,
    zeroth.renew_lease,
    zeroth.renew_leases,
    zeroth.current_generation,
    zeroth.current_holder,
    zeroth.get_recovery_checkpoint_id,
    zeroth.count_pending,
    zeroth.list_thread_runs,
    zeroth.get_thread_run,
    zeroth.commit_fenced,
    zeroth.update_run_progress,
    zeroth.start_run,
    zeroth.save_checkpoint,
    zeroth.complete_run,
    zeroth.fail_run,
    zeroth.cancel_run,
    zeroth.pause_run,
    zeroth.release_lease,
    zeroth.hand_back_to_pending,
    zeroth.expire_recovery_lease,
    zeroth.request_cancel,
    zeroth.request_cancel_v2,
    zeroth.resume_run
    TO zeroth_worker;

-- ---------------------------------------------------------------------------------------------
-- Readers: the operator views, and runs/checkpoints directly, one tenant at a time.
-- The table owner bypasses row-level security (no FORCE), so the SECURITY DEFINER functions,
-- which run as zeroth_owner, see every row as before; superusers bypass it too.
-- ---------------------------------------------------------------------------------------------

ALTER TABLE zeroth.runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE zeroth.checkpoints ENABLE ROW LEVEL SECURITY;
-- No policy: only the owner (and superusers) see slot rows.
ALTER TABLE zeroth.admission_slots ENABLE ROW LEVEL SECURITY;

-- current_setting(..., true) is NULL when unset, and NULL matches nothing: a reader that names no
-- tenant sees no run (fails closed).
CREATE POLICY runs_reader_tenant ON zeroth.runs FOR SELECT TO zeroth_reader
    USING (tenant_id = pg_catalog.current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY runs_reader_tenant ON zeroth.runs IS 'zeroth_reader sees the runs of the tenant named in the setting zeroth.tenant_id (none when unset).';
CREATE POLICY checkpoints_reader_tenant ON zeroth.checkpoints FOR SELECT TO zeroth_reader
    USING (tenant_id = pg_catalog.current_setting('zeroth.tenant_id', true));
COMMENT ON POLICY checkpoints_reader_tenant ON zeroth.checkpoints IS 'zeroth_reader sees the checkpoints of the tenant named in the setting zeroth.tenant_id (none when unset).';

-- Views over runs read as the caller, so the policies above filter them for a reader.
-- table_health holds no run data and keeps its owner's rights (statistics of the three tables).
ALTER VIEW zeroth.queue_depth SET (security_invoker = true);
ALTER VIEW zeroth.dead_letters SET (security_invoker = true);
ALTER VIEW zeroth.live_leases SET (security_invoker = true);
ALTER VIEW zeroth.expired_leases SET (security_invoker = true);

GRANT SELECT ON zeroth.runs, zeroth.checkpoints TO zeroth_reader;
GRANT SELECT ON zeroth.queue_depth, zeroth.dead_letters, zeroth.live_leases, zeroth.expired_leases,
                zeroth.table_health
    TO zeroth_reader;
