-- 0025_fourth_session: state changes for the work of the session of 2026-12-06 (fourth), one
-- section per helper.
--
-- Each section below names the issue it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;

-- ===== section: wal4 =====
-- WAL per completed run (issue 30): the row's layout again, so that a completion logs only what
-- it changes. A claim and a completion are non-HOT updates; PostgreSQL leaves out of the WAL
-- record the bytes the new version shares with the old at its start and at its end (prefix/suffix
-- compression, when the new version stays on its page: fillfactor 70, migration 0024). A
-- completion moves the holder's name and claim time from lease_worker_id / lease_acquired_at into
-- completed_worker_id / completed_claimed_at (the run's first attempt, zeroth._settle) and clears
-- the lease: the same bytes, in other columns. With lease_worker_id, lease_acquired_at right
-- after completed_worker_id, completed_claimed_at (only columns NULL in both versions between
-- them: progress, accounting, the dropped ones), the data of both versions from lease_generation
-- to the end are the same bytes: the claimed version holds "W T" where the completed one holds
-- "W T" too, the NULL pair of either taking no room. started_at, which a claim writes and a
-- completion keeps, goes there too. attempts (also written by a claim only) stays after status:
-- there it fills the 4 bytes before updated_at's alignment that a completion logs anyway.
-- Before, a completion logged everything from status to completed_claimed_at (attempts,
-- started_at, lease_generation, the worker id, the claim time: about 50 bytes it does not
-- change); now status, attempts, updated_at and finished_at (and output).
-- Each column is added again at the end, filled from the old one, which is then dropped, and the
-- new one renamed (as 0024 did); the columns after them (max_attempts … idempotency_key, moved by
-- 0024) are moved once more so that they stay behind everything either update writes. Their
-- defaults, NOT NULL, CHECK constraints (with their comments), column comments and indexes are
-- made again from their own definitions as they are when this runs.
-- The row has 71 attributes after this (the dropped ones count): one short of the most whose null
-- bitmap fits the 32-byte tuple header (72). A 73rd (the second column added later) makes every
-- new row version's header 40 bytes: 8 bytes more a row and in every heap record of the table.
-- Cost of the upgrade: one UPDATE of every row of zeroth.runs and the index builds, under the
-- ACCESS EXCLUSIVE lock of the ALTER TABLE (docs/dba-guide.md, "Upgrades"), as 0024.
CREATE TEMPORARY TABLE zeroth_0025_moved (position integer PRIMARY KEY, column_name text UNIQUE);
INSERT INTO zeroth_0025_moved
SELECT position, column_name
  FROM unnest(ARRAY['lease_worker_id', 'lease_acquired_at', 'started_at', 'max_attempts',
                    'checkpoint_seq', 'hand_backs', 'resumable', 'metadata', 'payload',
                    'created_at', 'run_after', 'priority', 'idempotency_key'])
       WITH ORDINALITY AS m(column_name, position);
-- Whatever the release being upgraded holds that is bound to a moved column (a view, a function
-- with a SQL-standard body, a trigger), with everything bound to those in turn: dropped, and made
-- again by the function files applied after the migrations (as 0024). An object outside schema
-- zeroth (a DBA's own view) is not dropped here: the upgrade stops and names it.
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
               AND a.attname IN (SELECT column_name FROM zeroth_0025_moved)
            UNION
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
            RAISE EXCEPTION 'migration 0025 moves columns of zeroth.runs that % reads: drop it first (and make it again after the upgrade)',
                v_object.description;
        END IF;
        EXECUTE v_object.statement;
    END LOOP;
END
$$;
-- What DROP COLUMN takes with it, as it is when this runs: each moved column's type, default,
-- NOT NULL and comment; the CHECK constraints naming one (with their comments); the indexes on
-- one (with their comments).
CREATE TEMPORARY TABLE zeroth_0025_columns AS
SELECT m.position, m.column_name, format_type(a.atttypid, a.atttypmod) AS column_type,
       pg_get_expr(d.adbin, d.adrelid) AS default_value, a.attnotnull AS not_null,
       col_description(a.attrelid, a.attnum) AS comment
  FROM zeroth_0025_moved m
  JOIN pg_attribute a ON a.attrelid = 'zeroth.runs'::regclass AND a.attname = m.column_name
                     AND NOT a.attisdropped
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum;
CREATE TEMPORARY TABLE zeroth_0025_checks AS
SELECT c.conname::text AS constraint_name, pg_get_constraintdef(c.oid) AS definition,
       obj_description(c.oid, 'pg_constraint') AS comment
  FROM pg_constraint c
 WHERE c.conrelid = 'zeroth.runs'::regclass AND c.contype = 'c'
   AND EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                  AND a.attname IN (SELECT column_name FROM zeroth_0025_moved));
CREATE TEMPORARY TABLE zeroth_0025_indexes AS
SELECT i.indexrelid::regclass::text AS index_name, pg_get_indexdef(i.indexrelid) AS definition,
       obj_description(i.indexrelid, 'pg_class') AS comment
  FROM pg_index i
 WHERE i.indrelid = 'zeroth.runs'::regclass
   AND EXISTS (SELECT 1 FROM pg_depend d
                 JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = i.indexrelid
                  AND d.refobjid = 'zeroth.runs'::regclass
                  AND a.attname IN (SELECT column_name FROM zeroth_0025_moved));
DO $$
DECLARE
    c record;
BEGIN
    IF (SELECT count(*) FROM zeroth_0025_columns) <> (SELECT count(*) FROM zeroth_0025_moved) THEN
        RAISE EXCEPTION 'migration 0025: zeroth.runs lacks a column it moves';
    END IF;
    FOR c IN SELECT * FROM zeroth_0025_columns ORDER BY position LOOP
        EXECUTE format('ALTER TABLE zeroth.runs ADD COLUMN %I %s', 'moved_' || c.column_name,
                       c.column_type);
    END LOOP;
    EXECUTE (SELECT 'UPDATE zeroth.runs SET '
                    || string_agg(format('%I = %I', 'moved_' || column_name, column_name), ', '
                                  ORDER BY position)
               FROM zeroth_0025_columns);
    EXECUTE (SELECT 'ALTER TABLE zeroth.runs '
                    || string_agg(format('DROP COLUMN %I', column_name), ', ' ORDER BY position)
               FROM zeroth_0025_columns);
    FOR c IN SELECT * FROM zeroth_0025_columns ORDER BY position LOOP
        EXECUTE format('ALTER TABLE zeroth.runs RENAME COLUMN %I TO %I',
                       'moved_' || c.column_name, c.column_name);
        IF c.default_value IS NOT NULL THEN
            EXECUTE format('ALTER TABLE zeroth.runs ALTER COLUMN %I SET DEFAULT %s',
                           c.column_name, c.default_value);
        END IF;
        IF c.not_null THEN
            EXECUTE format('ALTER TABLE zeroth.runs ALTER COLUMN %I SET NOT NULL', c.column_name);
        END IF;
        IF c.comment IS NOT NULL THEN
            EXECUTE format('COMMENT ON COLUMN zeroth.runs.%I IS %L', c.column_name, c.comment);
        END IF;
    END LOOP;
    FOR c IN SELECT * FROM zeroth_0025_checks ORDER BY constraint_name LOOP
        EXECUTE format('ALTER TABLE zeroth.runs ADD CONSTRAINT %I %s', c.constraint_name,
                       c.definition);
        IF c.comment IS NOT NULL THEN
            EXECUTE format('COMMENT ON CONSTRAINT %I ON zeroth.runs IS %L', c.constraint_name,
                           c.comment);
        END IF;
    END LOOP;
    FOR c IN SELECT * FROM zeroth_0025_indexes ORDER BY index_name LOOP
        EXECUTE c.definition;
        IF c.comment IS NOT NULL THEN
            EXECUTE format('COMMENT ON INDEX %s IS %L', c.index_name, c.comment);
        END IF;
    END LOOP;
    -- Statistics for the moved columns now, when the table holds runs (0024 says why not when
    -- it is empty).
    IF EXISTS (SELECT 1 FROM zeroth.runs) THEN
        ANALYZE zeroth.runs;
    END IF;
END
$$;
DROP TABLE zeroth_0025_moved;
DROP TABLE zeroth_0025_columns;
DROP TABLE zeroth_0025_checks;
DROP TABLE zeroth_0025_indexes;
