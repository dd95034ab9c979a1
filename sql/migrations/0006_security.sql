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
--
-- The functions, views and trigger this migration created when it was released live in
-- sql/functions/ now (one file each, re-applied by every upgrade: sql/README.md); this file
-- keeps what has state: types, tables, indexes, roles, policies and data changes.

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

GRANT SELECT ON zeroth.runs, zeroth.checkpoints TO zeroth_reader;
