-- 0024_hot_path_and_suite: state changes for the work of the session of 2026-12-06 (third):
-- the per-run cost of the hot path and claims on a dirty table (issue 30), the test suite
-- (issue 32) and high availability (issue 35).
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: claims on a dirty table (issue 30) =====

-- ===== section: WAL and index writes per run (issue 30) =====
-- fillfactor 80 → 70: a run's row grows from its enqueue to its completion (the lease, the start
-- and finish times, the completing worker kept in the row), and with 20% of a page free the
-- claims and completions of the runs inserted on it outgrow it: the new version goes to another
-- page, written whole (no prefix/suffix compression) after a heap LOCK record of the old one, and
-- the next access of the index entries of the old page cleans them up (btree DELETE). With 30%
-- free those updates stay on their page (bench/per_run_cost.py, worker at concurrency 1: about
-- 25 bytes of WAL a run fewer, and no larger a table: the finished rows fill the room). Only
-- rows inserted from now on are placed by it: no rewrite, a SHARE UPDATE EXCLUSIVE lock.
ALTER TABLE zeroth.runs SET (fillfactor = 70);
-- The row's layout: the columns no claim nor completion writes go to the end of the row. A claim
-- and a completion are non-HOT updates that log their new row version; PostgreSQL leaves out of
-- the WAL record only the bytes the new version shares with the old at its start and at its end
-- (prefix/suffix compression, when the new version stays on the page), so everything between the
-- first column an update changes (status, the 7th) and its last (lease_generation for a claim,
-- completed_claimed_at — the last column — for a completion) was logged at every claim and every
-- completion: among them the payload, the metadata and the idempotency key (a 1 kB payload: 2 kB
-- of WAL a run), and priority, run_after, created_at, max_attempts, checkpoint_seq, progress,
-- accounting, resumable and hand_backs. Moved behind completed_claimed_at they are in the common
-- suffix of both updates (bench/per_run_cost.py, worker at concurrency 1 with the empty payload
-- and metadata and no key: about 100 bytes of WAL a run fewer). Each is added again at the end,
-- filled from the old column, which is then dropped (a dropped column costs a new row version
-- nothing but a null-bitmap bit) and the new one renamed; defaults, NOT NULL, CHECK constraints
-- and column comments as they were. The indexes on priority, run_after, created_at and
-- idempotency_key (runs_claim_pending_idx, runs_created_not_running_idx, runs_thread_idx,
-- runs_idempotency_key_idx: dropped with the columns) are made again from their own definitions
-- as they are when this runs, with their comments. The views and the functions that read the
-- moved columns are dropped first and made again by the function files applied after the
-- migrations (sql/README.md).
-- Cost of the upgrade: one UPDATE of every row of zeroth.runs (a new version of each: the table
-- and its indexes write once what they hold, and the old versions wait for VACUUM) and four index
-- builds, under the ACCESS EXCLUSIVE lock of the ALTER TABLE (docs/dba-guide.md, "Upgrades").
DROP VIEW IF EXISTS zeroth.scope_overview;
DROP VIEW IF EXISTS zeroth.run_list;
DROP VIEW IF EXISTS zeroth.dead_letters;
DROP VIEW IF EXISTS zeroth.expired_leases;
DROP VIEW IF EXISTS zeroth.pinned_runs;
DROP VIEW IF EXISTS zeroth.queue_depth;
DROP FUNCTION IF EXISTS zeroth.list_thread_runs(text, text, text, integer);
DROP FUNCTION IF EXISTS zeroth.get_thread_run(uuid, text, text);
DROP FUNCTION IF EXISTS zeroth._thread_run(zeroth.runs);
-- And whatever else the release being upgraded holds that is bound to a moved column (a view, a
-- function with a SQL-standard body, a trigger's WHEN), with everything bound to those in turn:
-- the function files of releases 0010 to 0022 made zeroth._scope_has_due_run a SQL-standard
-- body reading run_after, and DROP COLUMN failed on it ('other objects depend on it': no
-- database of those releases could reach head). Each is made again by the function files
-- applied after the migrations, as far as it still exists. An object outside schema zeroth (a
-- DBA's own view) is not dropped here: the upgrade stops and names it.
DO $$
DECLARE
    v_object record;
BEGIN
    FOR v_object IN
        WITH RECURSIVE bound AS (
            SELECT d.classid, d.objid
              FROM pg_depend d
              JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
             WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = 'zeroth.runs'::regclass
               AND d.classid IN ('pg_proc'::regclass, 'pg_rewrite'::regclass,
                                 'pg_trigger'::regclass)
               AND d.deptype = 'n'
               AND a.attname IN ('max_attempts', 'checkpoint_seq', 'progress', 'accounting',
                                 'resumable', 'hand_backs', 'metadata', 'payload', 'created_at',
                                 'run_after', 'priority', 'idempotency_key')
            UNION
            -- what is bound to those: to a view (its rule's relation) or to a function
            SELECT d.classid, d.objid
              FROM bound b
              LEFT JOIN pg_rewrite w ON b.classid = 'pg_rewrite'::regclass AND w.oid = b.objid
              JOIN pg_depend d
                ON d.refclassid = CASE WHEN w.oid IS NULL THEN b.classid
                                       ELSE 'pg_class'::regclass END
               AND d.refobjid = coalesce(w.ev_class, b.objid)
             WHERE b.classid <> 'pg_trigger'::regclass
               AND d.classid IN ('pg_proc'::regclass, 'pg_rewrite'::regclass,
                                 'pg_trigger'::regclass)
               AND d.deptype = 'n'
               AND NOT (d.classid = 'pg_rewrite'::regclass AND d.objid IS NOT DISTINCT FROM w.oid)
        )
        SELECT CASE b.classid
                   WHEN 'pg_proc'::regclass THEN
                       format('DROP %s IF EXISTS %s CASCADE',
                              CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END,
                              p.oid::regprocedure)
                   WHEN 'pg_rewrite'::regclass THEN
                       format('DROP VIEW IF EXISTS %s CASCADE', w.ev_class::regclass)
                   ELSE format('DROP TRIGGER IF EXISTS %I ON %s', t.tgname, t.tgrelid::regclass)
               END AS statement,
               coalesce(p.pronamespace, c.relnamespace, tc.relnamespace)
                   = 'zeroth'::regnamespace AS ours,
               pg_describe_object(b.classid, b.objid, 0) AS description
          FROM bound b
          LEFT JOIN pg_proc p ON b.classid = 'pg_proc'::regclass AND p.oid = b.objid
          LEFT JOIN pg_rewrite w ON b.classid = 'pg_rewrite'::regclass AND w.oid = b.objid
          LEFT JOIN pg_class c ON c.oid = w.ev_class
          LEFT JOIN pg_trigger t ON b.classid = 'pg_trigger'::regclass AND t.oid = b.objid
          LEFT JOIN pg_class tc ON tc.oid = t.tgrelid
         ORDER BY 2, 1
    LOOP
        IF NOT v_object.ours THEN
            RAISE EXCEPTION 'migration 0024 moves columns of zeroth.runs that % reads: drop it first (and make it again after the upgrade)',
                v_object.description;
        END IF;
        EXECUTE v_object.statement;
    END LOOP;
END
$$;
CREATE TEMPORARY TABLE zeroth_0024_run_column_comments AS
SELECT a.attname::text AS column_name, col_description(a.attrelid, a.attnum) AS comment
  FROM pg_attribute a
 WHERE a.attrelid = 'zeroth.runs'::regclass AND NOT a.attisdropped
   AND a.attname IN ('max_attempts', 'checkpoint_seq', 'progress', 'accounting', 'resumable',
                     'hand_backs', 'metadata', 'payload', 'created_at', 'run_after', 'priority',
                     'idempotency_key')
   AND col_description(a.attrelid, a.attnum) IS NOT NULL;
-- The indexes on the moved columns (dropped with them), as they are when this runs: made again
-- from their own definitions, with their comments.
CREATE TEMPORARY TABLE zeroth_0024_run_indexes AS
SELECT i.indexrelid::regclass::text AS index_name, pg_get_indexdef(i.indexrelid) AS definition,
       obj_description(i.indexrelid, 'pg_class') AS comment
  FROM pg_index i
 WHERE i.indrelid = 'zeroth.runs'::regclass
   AND EXISTS (SELECT 1 FROM pg_depend d
                 JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
                  AND d.refobjid = 'zeroth.runs'::regclass
                  AND a.attname IN ('created_at', 'run_after', 'priority', 'idempotency_key'));
ALTER TABLE zeroth.runs
    ADD COLUMN moved_max_attempts integer,
    ADD COLUMN moved_checkpoint_seq bigint,
    ADD COLUMN moved_hand_backs integer,
    ADD COLUMN moved_resumable boolean,
    ADD COLUMN moved_progress jsonb,
    ADD COLUMN moved_accounting jsonb,
    ADD COLUMN moved_metadata jsonb,
    ADD COLUMN moved_payload jsonb,
    ADD COLUMN moved_created_at timestamptz,
    ADD COLUMN moved_run_after timestamptz,
    ADD COLUMN moved_priority integer,
    ADD COLUMN moved_idempotency_key text;
UPDATE zeroth.runs
   SET moved_max_attempts = max_attempts, moved_checkpoint_seq = checkpoint_seq,
       moved_hand_backs = hand_backs, moved_resumable = resumable, moved_progress = progress,
       moved_accounting = accounting, moved_metadata = metadata, moved_payload = payload,
       moved_created_at = created_at, moved_run_after = run_after, moved_priority = priority,
       moved_idempotency_key = idempotency_key;
ALTER TABLE zeroth.runs
    DROP COLUMN max_attempts, DROP COLUMN checkpoint_seq, DROP COLUMN hand_backs,
    DROP COLUMN resumable, DROP COLUMN progress, DROP COLUMN accounting, DROP COLUMN metadata,
    DROP COLUMN payload, DROP COLUMN created_at, DROP COLUMN run_after, DROP COLUMN priority,
    DROP COLUMN idempotency_key;
ALTER TABLE zeroth.runs RENAME COLUMN moved_max_attempts TO max_attempts;
ALTER TABLE zeroth.runs RENAME COLUMN moved_checkpoint_seq TO checkpoint_seq;
ALTER TABLE zeroth.runs RENAME COLUMN moved_hand_backs TO hand_backs;
ALTER TABLE zeroth.runs RENAME COLUMN moved_resumable TO resumable;
ALTER TABLE zeroth.runs RENAME COLUMN moved_progress TO progress;
ALTER TABLE zeroth.runs RENAME COLUMN moved_accounting TO accounting;
ALTER TABLE zeroth.runs RENAME COLUMN moved_metadata TO metadata;
ALTER TABLE zeroth.runs RENAME COLUMN moved_payload TO payload;
ALTER TABLE zeroth.runs RENAME COLUMN moved_created_at TO created_at;
ALTER TABLE zeroth.runs RENAME COLUMN moved_run_after TO run_after;
ALTER TABLE zeroth.runs RENAME COLUMN moved_priority TO priority;
ALTER TABLE zeroth.runs RENAME COLUMN moved_idempotency_key TO idempotency_key;
ALTER TABLE zeroth.runs
    ALTER COLUMN max_attempts SET DEFAULT 3, ALTER COLUMN max_attempts SET NOT NULL,
    ALTER COLUMN checkpoint_seq SET DEFAULT 0, ALTER COLUMN checkpoint_seq SET NOT NULL,
    ALTER COLUMN hand_backs SET DEFAULT 0, ALTER COLUMN hand_backs SET NOT NULL,
    ALTER COLUMN resumable SET DEFAULT true, ALTER COLUMN resumable SET NOT NULL,
    ALTER COLUMN metadata SET DEFAULT '{}'::jsonb, ALTER COLUMN metadata SET NOT NULL,
    ALTER COLUMN payload SET DEFAULT '{}'::jsonb, ALTER COLUMN payload SET NOT NULL,
    ALTER COLUMN created_at SET NOT NULL, ALTER COLUMN run_after SET NOT NULL,
    ALTER COLUMN priority SET DEFAULT 0, ALTER COLUMN priority SET NOT NULL,
    ADD CONSTRAINT runs_attempts_valid CHECK (attempts >= 0 AND max_attempts >= 1),
    ADD CONSTRAINT runs_hand_backs_nonnegative CHECK (hand_backs >= 0),
    ADD CONSTRAINT runs_accounting_object
        CHECK (accounting IS NULL OR jsonb_typeof(accounting) = 'object'),
    ADD CONSTRAINT runs_metadata_object CHECK (jsonb_typeof(metadata) = 'object'),
    ADD CONSTRAINT runs_payload_object CHECK (jsonb_typeof(payload) = 'object');
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT column_name, comment FROM zeroth_0024_run_column_comments LOOP
        EXECUTE format('COMMENT ON COLUMN zeroth.runs.%I IS %L', c.column_name, c.comment);
    END LOOP;
    FOR c IN SELECT index_name, definition, comment FROM zeroth_0024_run_indexes ORDER BY 1 LOOP
        EXECUTE c.definition;
        IF c.comment IS NOT NULL THEN
            EXECUTE format('COMMENT ON INDEX %s IS %L', c.index_name, c.comment);
        END IF;
    END LOOP;
END
$$;
DROP TABLE zeroth_0024_run_column_comments;
DROP TABLE zeroth_0024_run_indexes;
-- The moved columns are new columns to the planner: no statistics until the next ANALYZE, and
-- the UPDATE above left a dead version of every row. Statistics now (a sample, within the
-- upgrade's transaction), so the first plans after the upgrade are made with them (issue 30).
-- Only when the table holds runs: an ANALYZE of the empty table of a fresh install records it as
-- analyzed and empty (reltuples 0), so the planner no longer assumes its minimum of 10 pages for
-- a table never analyzed, and the generic plans the worker's sessions cache while it is small
-- walked it once it grew (tests/plans/test_generic_plans.py: 1,928,192 blocks read by
-- renew_lease, 994,308 by complete_runs; tests/plans/test_fresh_database.py).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM zeroth.runs) THEN
        ANALYZE zeroth.runs;
    END IF;
END
$$;

-- ===== section: worker throughput (issue 30) =====

-- ===== section: test suite (issue 32) =====
-- zeroth.lock_stripes (0008) has been unused since 0009: thread admissions lock a row of
-- zeroth.thread_locks and slot creation takes no shared lock, and no function of
-- sql/functions reads it. Its 17,408 rows were still copied into every database and read by
-- every whole-table check (the fuzz and hostile-caller tiers checksum every table after each
-- call: this table was 97% of that work). Its comment promised a later migration would drop it.
-- CASCADE: in a database upgraded from 0008 or earlier in this same upgrade, 0008's SQL-standard
-- bodies (_lock_thread, _thread_stripe) still depend on it here; the function files, applied
-- after this file in the same transaction, put back every function that still exists.
DROP TABLE zeroth.lock_stripes CASCADE;

-- ===== section: high availability (issue 35) =====
