-- sql/functions/views/table_health.sql: the operator view zeroth.table_health. Re-applied by every
-- upgrade (sql/README.md).
-- Table health of the three hot tables, and the oldest transaction horizon holding back vacuum in
-- this database: a backend's snapshot (backend_xmin), a replication slot's xmin, or a prepared
-- transaction. Dead tuples that vacuum may not remove yet accumulate behind it, so a large
-- oldest_xmin_age next to a growing n_dead_tup names the culprit. Other users' backend_xmin is
-- only visible with pg_read_all_stats (e.g. through pg_monitor); without it those sessions are
-- not seen.
-- The oldest one in another database of the server (oldest_xmin_elsewhere, its age and how long
-- it has been open; columns appended last): it does not hold back VACUUM here (PostgreSQL
-- computes that horizon per database), but while it is open reads here cannot prune pages or
-- mark dead index entries as they go (that horizon is the whole server's: docs/dba-guide.md),
-- so between autovacuums the calls that walk dead entries read more.
-- Not security_invoker: it holds no run data and keeps its owner's rights (statistics of the
-- hot tables).
CREATE OR REPLACE VIEW zeroth.table_health AS
WITH holders AS (
    -- here: this database's (or a backend of none: a walsender's feedback), which hold back
    -- VACUUM here; else another database's, named with it.
    SELECT a.datname = current_database() OR a.datname IS NULL AS here,
           format('backend %s%s (%s, %s)', a.pid,
                  CASE WHEN a.datname <> current_database() THEN ' in database ' || a.datname END,
                  coalesce(a.state, 'unknown'),
                  coalesce(nullif(a.application_name, ''), a.backend_type)) AS holder,
           age(a.backend_xmin) AS xmin_age,
           a.xact_start AS since
      FROM pg_stat_activity a
     WHERE a.backend_xmin IS NOT NULL
       AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT true, format('replication slot %s', s.slot_name), age(s.xmin), NULL::timestamptz
      FROM pg_replication_slots s
     WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT p.database = current_database(),
           format('prepared transaction %s%s', p.gid,
                  CASE WHEN p.database <> current_database() THEN ' in database ' || p.database END),
           age(p.transaction), p.prepared
      FROM pg_prepared_xacts p
), horizon AS (
    SELECT h.holder, h.xmin_age, h.since FROM holders h WHERE h.here
     ORDER BY h.xmin_age DESC LIMIT 1
), elsewhere AS (
    SELECT h.holder, h.xmin_age, h.since FROM holders h WHERE NOT h.here
     ORDER BY h.xmin_age DESC LIMIT 1
)
SELECT t.relname::text AS table_name,
       t.n_live_tup,
       t.n_dead_tup,
       round(t.n_dead_tup::numeric / nullif(t.n_live_tup + t.n_dead_tup, 0), 4) AS dead_ratio,
       t.n_tup_upd,
       t.n_tup_hot_upd,
       round(t.n_tup_hot_upd::numeric / nullif(t.n_tup_upd, 0), 4) AS hot_update_ratio,
       t.last_autovacuum,
       t.last_vacuum,
       t.last_autoanalyze,
       t.autovacuum_count,
       pg_table_size(t.relid) AS table_bytes,
       pg_indexes_size(t.relid) AS index_bytes,
       pg_size_pretty(pg_table_size(t.relid)) AS table_size,
       pg_size_pretty(pg_indexes_size(t.relid)) AS index_size,
       h.holder AS oldest_xmin_holder,
       h.xmin_age AS oldest_xmin_age,
       clock_timestamp() - h.since AS oldest_xmin_duration,
       e.holder AS oldest_xmin_elsewhere,
       e.xmin_age AS oldest_xmin_elsewhere_age,
       clock_timestamp() - e.since AS oldest_xmin_elsewhere_duration
  FROM pg_stat_all_tables t
  LEFT JOIN horizon h ON true
  LEFT JOIN elsewhere e ON true
 WHERE t.schemaname = 'zeroth'
   AND t.relname IN ('runs', 'checkpoints', 'admission_slots');
COMMENT ON VIEW zeroth.table_health IS 'Per hot table (runs, checkpoints, admission_slots): live and dead tuples, the share of HOT updates (lease renewals should be HOT), last (auto)vacuum and autoanalyze, table and index size; and, on every row, the oldest transaction horizon in this database that holds back vacuum (a backend snapshot, a replication slot or a prepared transaction), its age in transactions and, for backends and prepared transactions, how long it has been open; and the same of the oldest in another database of the server (oldest_xmin_elsewhere*), which does not hold back vacuum here but keeps reads here from pruning pages and marking dead index entries as they go. Other users'' backends are visible only with pg_read_all_stats (pg_monitor).';
ALTER VIEW zeroth.table_health OWNER TO zeroth_owner;
REVOKE ALL ON zeroth.table_health FROM PUBLIC;
GRANT SELECT ON zeroth.table_health TO zeroth_reader;
