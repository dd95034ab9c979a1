#!/usr/bin/env bash
# Rate limits from psql alone: a DBA sets "at most 3 starts per 2 seconds" on a key, names it as
# the rate limit of a scope, and a worker's claims take their starts from it. A claim cut short
# or held back by the limit says when the next start becomes possible (retry_at, database time)
# and how long that is from the claim (retry_after, seconds): the worker sleeps exactly that.
#
# Usage:
#   examples/psql/rate_limits.sh 'postgresql://user:pass@host/db'
#   DATABASE_URL='postgresql://...' examples/psql/rate_limits.sh
# Environment:
#   PSQL        the psql binary to use (default: psql from PATH)
#   DEPLOYMENT  the deployment_ref to use (default: a fresh one per invocation)
#
# The role must be a member of zeroth_owner (a DBA): zeroth.set_rate_limit and
# zeroth.scope_limits are written by the owner only. The script enqueues five runs, starts them
# under the limit (three, then two after the window moved on) and leaves them completed.

set -euo pipefail

DSN="${1:-${DATABASE_URL:-}}"
if [[ -z "$DSN" ]]; then
    echo "usage: $0 DSN   (or set DATABASE_URL)" >&2
    exit 2
fi
PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-rate-$(date +%s)-$$}"
KEY="$DEPLOYMENT-quota"
WORKER='psql-rate-worker'

# As in lifecycle.sh: SQL on stdin, values passed with -v and quoted by psql (:'name').
sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q "$@" "$DSN"
}

echo "deployment $DEPLOYMENT"

# --- 1. The DBA: a key of 3 starts per 2 seconds, and the scope that draws from it -------------
# set_rate_limit validates (ZP008 on a bad value) and creates or changes the key; a plain
# INSERT/UPDATE of zeroth.rate_limits works too. Several scopes may name one key and share it.
sql -v key="$KEY" -v deployment="$DEPLOYMENT" <<'SQL'
SELECT zeroth.set_rate_limit(name => :'key', max_starts => 3, period_seconds => 2,
                             note => 'the provider allows 3 calls per 2 s');
INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, rate_limit)
VALUES ('default', :'deployment', :'key');
SQL
echo "rate limit $KEY: 3 starts per 2 s"

# --- 2. A producer enqueues five runs ------------------------------------------------------------
sql -v deployment="$DEPLOYMENT" <<'SQL' >/dev/null
SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => :'deployment',
    runs => '[{"payload": {"n": 1}}, {"payload": {"n": 2}}, {"payload": {"n": 3}},
              {"payload": {"n": 4}}, {"payload": {"n": 5}}]');
SQL
echo "enqueued 5"

# claim: claim_and_start a batch of 10; prints "<runs claimed> <retry_after or ->" and completes
# what it claimed (a real worker would do the work first).
claim() {
    sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$WORKER" <<'SQL'
WITH claimed AS MATERIALIZED (
    SELECT * FROM zeroth.claim_and_start(deployment_ref => :'deployment', worker_id => :'worker',
                                         batch_size => 10, lease_seconds => 60)
), completed AS (
    SELECT zeroth.complete_run(run_id => c.run_id, worker_id => :'worker',
                               generation => c.lease_generation, output => '{}') AS ok
      FROM claimed c WHERE c.run_id IS NOT NULL
)
SELECT (SELECT count(*) FROM completed WHERE ok),
       coalesce((SELECT round(max(c.retry_after)::numeric, 3)::text FROM claimed c), '-');
SQL
}

# --- 3. The worker: the first claim gets 3 of 10 (the limit cut it short) ----------------------
read -r GOT WAIT < <(claim)
echo "claimed $GOT, next start possible in ${WAIT}s"

# --- 4. At once again: held back (one run_id-NULL row with retry_at), nothing started -----------
read -r GOT WAIT < <(claim)
echo "held back: claimed $GOT, next start possible in ${WAIT}s"

# --- 5. Sleep what the claim said, not a poll interval: then the window has room again ----------
sleep "$WAIT"
read -r GOT WAIT < <(claim)
echo "after the wait: claimed $GOT"

# --- 6. The record: start times on the database clock, never more than 3 in any 2 s -----------
MOST=$(sql -v deployment="$DEPLOYMENT" <<'SQL'
SELECT max((SELECT count(*) FROM zeroth.runs o
             WHERE o.deployment_ref = r.deployment_ref
               AND o.started_at > r.started_at - interval '2 seconds'
               AND o.started_at <= r.started_at))
  FROM zeroth.runs r WHERE r.deployment_ref = :'deployment';
SQL
)
echo "most starts in any 2 s window: $MOST"
