#!/usr/bin/env bash
# A complete zeroth_pg worker lifecycle driven by nothing but psql.
#
# zeroth_pg's API is a set of PL/pgSQL functions in schema `zeroth`; the Python client is only a
# thin mirror of them. This script is the proof that any language that can run
# `SELECT zeroth.some_function(...)` can be a producer, a worker or an operator (the same idea as
# pgmq's psql examples). It walks one run through its whole life, then shows fencing: a worker
# whose lease was taken over can no longer write, even if it wakes up and tries.
#
# Usage:
#   examples/psql/lifecycle.sh 'postgresql://user:pass@host/db'
#   DATABASE_URL='postgresql://...' examples/psql/lifecycle.sh
# Environment:
#   PSQL        the psql binary to use (default: psql from PATH)
#   DEPLOYMENT  the deployment_ref to use (default: a fresh one per invocation, so the claims
#               below can only ever pick up the runs this script enqueued)
#
# The database must have the zeroth schema installed (sql/migrations/*.sql, or `zeroth-pg
# migrate`). The script writes two runs and leaves them completed.

set -euo pipefail

DSN="${1:-${DATABASE_URL:-}}"
if [[ -z "$DSN" ]]; then
    echo "usage: $0 DSN   (or set DATABASE_URL)" >&2
    exit 2
fi
PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-example-$(date +%s)-$$}"
WORKER='psql-worker'
WORKER_2='psql-worker-2'

# sql [-v name=value ...] <<'SQL' ... SQL
# Runs the SQL on stdin. -X: ignore ~/.psqlrc; ON_ERROR_STOP: a SQL error makes psql (and, via
# `set -e`, this script) fail; -A -t: unaligned tuples only, so a SELECT prints bare values;
# -q: no command tags. Values are passed with -v and referenced as :'name', which psql quotes as a
# SQL literal: no string is ever pasted into the SQL text by the shell. (Variables are not
# interpolated in `psql -c`, which is why the SQL comes on stdin.)
sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q "$@" "$DSN"
}

# expect WANT GOT WHAT: stop with a message unless GOT equals WANT.
expect() {
    if [[ "$2" != "$1" ]]; then
        echo "unexpected result of $3: got '$2', expected '$1'" >&2
        exit 1
    fi
}

echo "deployment $DEPLOYMENT"

# --- 1. A producer enqueues a run --------------------------------------------------------------
# enqueue_run returns (run_id, created, status). Tenant and workspace are left NULL: the default
# tenant's null workspace. Every function is called with named notation (param => value).
RUN_ID=$(sql -v deployment="$DEPLOYMENT" <<'SQL'
SELECT run_id
  FROM zeroth.enqueue_run(deployment_ref => :'deployment',
                          payload        => '{"task": "summarise", "document": 42}');
SQL
)
echo "enqueued $RUN_ID"

# --- 2. A worker claims it ---------------------------------------------------------------------
# claim_pending leases the oldest highest-priority pending run and bumps its lease generation:
# the fencing token every later write must present. An empty queue returns one row with a NULL
# run_id (it also carries saturation info), hence the WHERE. -F sets psql's field separator.
read -r CLAIMED GENERATION < <(sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$WORKER" <<'SQL'
SELECT run_id, lease_generation
  FROM zeroth.claim_pending(deployment_ref => :'deployment', worker_id => :'worker',
                            lease_seconds  => 60)
 WHERE run_id IS NOT NULL;
SQL
)
expect "$RUN_ID" "${CLAIMED:-}" "claim_pending"
echo "claimed $RUN_ID generation $GENERATION"

# Every fenced call below names (run_id, worker_id, generation); the functions check all three
# and the lease expiry inside the UPDATE that writes, so a refused write changes nothing.
fenced() {
    sql -v run_id="$RUN_ID" -v worker="$WORKER" -v gen="$GENERATION" "$@"
}

# --- 3. Start it: pending → running (counts an attempt) ----------------------------------------
OK=$(fenced <<'SQL'
SELECT zeroth.start_run(run_id => :'run_id', worker_id => :'worker', generation => :gen);
SQL
)
expect t "$OK" "start_run"
echo "started $RUN_ID: start_run -> $OK"

# --- 4. Save two checkpoints ---------------------------------------------------------------------
# save_checkpoint returns the checkpoint id (NULL if the lease was lost). A worker that takes the
# run over later is handed the latest one by claim_orphaned.
for STEP in 1 2; do
    CHECKPOINT=$(fenced -v step="$STEP" <<'SQL'
SELECT zeroth.save_checkpoint(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                              data   => jsonb_build_object('step', :step, 'done', :step * 50));
SQL
)
    [[ -n "$CHECKPOINT" ]] || { echo "save_checkpoint was refused" >&2; exit 1; }
    echo "checkpoint $STEP $CHECKPOINT"
done

# --- 5. Renew the lease (a real worker does this every lease_seconds / 3 or so) -----------------
OK=$(fenced <<'SQL'
SELECT zeroth.renew_lease(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                          lease_seconds => 60);
SQL
)
expect t "$OK" "renew_lease"
echo "renewed lease: renew_lease -> $OK"

# --- 6. Commit progress through commit_fenced ------------------------------------------------------
# commit_fenced writes only allowlisted columns (output, error, metadata, progress); naming a lease,
# status or identity column raises SQLSTATE ZP004, however it is spelled.
OK=$(fenced <<'SQL'
SELECT zeroth.commit_fenced(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                            columns => '{"progress": {"percent": 100, "note": "written by psql"}}');
SQL
)
expect t "$OK" "commit_fenced"
echo "committed progress: commit_fenced -> $OK"

# --- 7. Complete it with an output: running → completed, lease cleared --------------------------
OK=$(fenced <<'SQL'
SELECT zeroth.complete_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                           output => '{"summary": "done by psql-worker"}');
SQL
)
expect t "$OK" "complete_run"
echo "completed $RUN_ID: complete_run -> $OK"

# =================================================================================================
# Fencing: a worker that lost its lease can never write again.
# =================================================================================================

# --- 8. A second run, claimed and started by psql-worker (generation 1) -------------------------
RUN_2=$(sql -v deployment="$DEPLOYMENT" <<'SQL'
SELECT run_id FROM zeroth.enqueue_run(deployment_ref => :'deployment',
                                      payload        => '{"task": "translate"}');
SQL
)
echo "enqueued $RUN_2"
read -r CLAIMED STALE_GEN < <(sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$WORKER" <<'SQL'
SELECT run_id, lease_generation
  FROM zeroth.claim_pending(deployment_ref => :'deployment', worker_id => :'worker')
 WHERE run_id IS NOT NULL;
SQL
)
expect "$RUN_2" "${CLAIMED:-}" "claim_pending"
echo "claimed $RUN_2 generation $STALE_GEN"
OK=$(sql -v run_id="$RUN_2" -v worker="$WORKER" -v gen="$STALE_GEN" <<'SQL'
SELECT zeroth.start_run(run_id => :'run_id', worker_id => :'worker', generation => :gen)
   AND zeroth.save_checkpoint(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                              data => '{"step": 1}') IS NOT NULL;
SQL
)
expect t "$OK" "start_run + save_checkpoint"
echo "started $RUN_2 and saved a checkpoint"

# --- 9. psql-worker "crashes": its lease runs out ------------------------------------------------
# In production the lease simply expires (lease_seconds after the last renewal). Rather than
# sleep, an operator expires it now with clear_lease (admin, unfenced): a running run keeps its
# holder with a lease in the past, so it stays recoverable and is never stranded.
OK=$(sql -v run_id="$RUN_2" <<'SQL'
SELECT zeroth.clear_lease(run_id => :'run_id');
SQL
)
expect t "$OK" "clear_lease"
echo "lease of $RUN_2 expired: clear_lease -> $OK"

# --- 10. psql-worker-2 takes it over: new generation, handed the latest checkpoint --------------
read -r CLAIMED NEW_GEN RECOVERY < <(sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$WORKER_2" <<'SQL'
SELECT run_id, lease_generation, recovery_checkpoint_id
  FROM zeroth.claim_orphaned(deployment_ref => :'deployment', worker_id => :'worker')
 WHERE run_id IS NOT NULL;
SQL
)
expect "$RUN_2" "${CLAIMED:-}" "claim_orphaned"
echo "$WORKER_2 took over $RUN_2 generation $NEW_GEN (resumes from checkpoint $RECOVERY)"

# --- 11. The stale owner wakes up and tries to write: every fenced call is refused --------------
# Refusals are return values (false / NULL), not errors, and they change nothing.
read -r RENEWED COMMITTED COMPLETED < <(sql -F ' ' -v run_id="$RUN_2" -v worker="$WORKER" \
    -v gen="$STALE_GEN" <<'SQL'
SELECT zeroth.renew_lease(run_id => :'run_id', worker_id => :'worker', generation => :gen),
       zeroth.commit_fenced(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                            columns => '{"output": {"summary": "stale"}}'),
       zeroth.complete_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                           output => '{"summary": "stale"}');
SQL
)
expect f "$RENEWED" "stale renew_lease"
expect f "$COMMITTED" "stale commit_fenced"
expect f "$COMPLETED" "stale complete_run"
echo "stale generation $STALE_GEN refused: renew_lease -> $RENEWED"
echo "stale generation $STALE_GEN refused: commit_fenced -> $COMMITTED"
echo "stale generation $STALE_GEN refused: complete_run -> $COMPLETED"

# --- 12. The current owner (generation 2) completes it -------------------------------------------
OK=$(sql -v run_id="$RUN_2" -v worker="$WORKER_2" -v gen="$NEW_GEN" <<'SQL'
SELECT zeroth.complete_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                           output => '{"summary": "done by psql-worker-2"}');
SQL
)
expect t "$OK" "complete_run"
echo "generation $NEW_GEN completed $RUN_2: complete_run -> $OK"

# --- 13. Read back: plain SELECTs on the table are fine for looking -----------------------------
sql -F ' ' -v run_1="$RUN_ID" -v run_2="$RUN_2" <<'SQL'
SELECT 'final', r.run_id, r.status, 'generation', r.lease_generation, r.output ->> 'summary'
  FROM zeroth.runs r
 WHERE r.run_id IN (:'run_1', :'run_2')
 ORDER BY r.created_at;
SQL
