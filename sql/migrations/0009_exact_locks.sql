-- 0009_exact_locks: the admissions of a thread are serialised by a row of their own (red-team
-- finding F1 after issue 11); zeroth.code_version records what the function files last applied.
--
-- zeroth.lock_stripes (0008) spread every tenant's threads over 16384 shared stripes, and a
-- thread's stripe was computable (hashtextextended of its key with a constant seed). A
-- zeroth_worker acting only in its own tenant enqueued 16384 thread runs chosen to cover every
-- stripe in one open transaction, and every other tenant's admissions waited for as long as it
-- kept the transaction open; 1024 workspaces covering the scope stripes made other tenants' first
-- claims report saturation. Now the lock row is keyed by (tenant, workspace, thread) exactly and
-- created on first use, so a session can only ever hold up its own threads; a scope's first slot
-- rows are created with no shared lock at all (sql/functions/internal/slots.sql).
--
-- zeroth.lock_stripes is used by no function from this revision on. It stays until a later
-- migration drops it: the functions are re-applied after this file commits, and calls of the
-- previous functions in between must still find it.

CREATE TABLE zeroth.thread_locks (
    tenant_id     text NOT NULL,
    workspace_key text NOT NULL,
    thread_id     text NOT NULL,
    CONSTRAINT thread_locks_pkey PRIMARY KEY (tenant_id, workspace_key, thread_id)
);
COMMENT ON TABLE zeroth.thread_locks IS 'One row per thread that has been admitted to: its row lock serialises the admissions and redrives of that thread (zeroth._lock_thread). Created on first use, deleted by prune_runs once the thread has no runs left. Locked by zeroth functions only: no role but zeroth_owner can read or lock it.';
ALTER TABLE zeroth.thread_locks OWNER TO zeroth_owner;
ALTER TABLE zeroth.thread_locks ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.thread_locks FROM PUBLIC;

COMMENT ON TABLE zeroth.lock_stripes IS 'Unused since revision 0009 (thread admissions lock zeroth.thread_locks; slot creation takes no shared lock); kept for the functions of 0008 during an upgrade, dropped by a later migration.';

-- What the last upgrade applied from sql/functions (red-team pass 3, finding C): the digest of
-- the function files and a digest of what the catalog then held for them. An upgrade re-applies
-- the files only when either differs (a new package, or someone changed a function by hand), so
-- an upgrade with nothing to do takes no lock: re-creating the trigger and the views would wait
-- for any session idle in a transaction that touched them, and every call would queue behind.
CREATE TABLE zeroth.code_version (
    id             boolean     NOT NULL DEFAULT true,
    files_sha256   text        NOT NULL,
    catalog_md5    text        NOT NULL,
    package_version text       NOT NULL,
    applied_at     timestamptz NOT NULL,
    CONSTRAINT code_version_pkey PRIMARY KEY (id),
    CONSTRAINT code_version_one_row CHECK (id)
);
COMMENT ON TABLE zeroth.code_version IS 'One row: the sha256 of the sql/functions files the last upgrade applied, the md5 of the catalog''s definitions of the schema''s functions, views and triggers right after, and the zeroth-pg version that applied them (an older package refuses to put older code back). Written by zeroth_pg.migrate; readable by zeroth_owner only.';
ALTER TABLE zeroth.code_version OWNER TO zeroth_owner;
ALTER TABLE zeroth.code_version ENABLE ROW LEVEL SECURITY;
REVOKE ALL ON zeroth.code_version FROM PUBLIC;
