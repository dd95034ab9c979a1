#!/usr/bin/env bash
# Durable sleep driven by nothing but psql: a run that sleeps three times for one second.
#
# zeroth.sleep_run ends the holder's attempt with "resume me at T": the run goes back to pending
# with run_after = T (here: the database clock + 1 s), its attempt is given back (sleeping is not
# failing: the run below has max_attempts 1 and sleeps three times), its lease is released, and the
# checkpoint passed to it is saved in the same call. At T any worker's ordinary claim takes it and
# is handed that checkpoint as the recovery point: the work is re-entered from the checkpoint, not
# continued in memory. Two "workers" (psql-sleeper-a and psql-sleeper-b) take turns here. Then a
# worker that held an older generation tries to put the run to sleep and is refused.
#
# Usage:
#   examples/psql/durable_sleep.sh 'postgresql://user:pass@host/db'
#   DATABASE_URL='postgresql://...' examples/psql/durable_sleep.sh
# Environment:
#   PSQL        the psql binary to use (default: psql from PATH)
#   DEPLOYMENT  the deployment_ref to use (default: a fresh one per invocation)
#
# The database must have the zeroth schema installed (`zeroth-pg migrate`). The script writes one
# run and leaves it completed. It takes about four seconds (three sleeps of one second).

set -euo pipefail

DSN="${1:-${DATABASE_URL:-}}"
if [[ -z "$DSN" ]]; then
    echo "usage: $0 DSN   (or set DATABASE_URL)" >&2
    exit 2
fi
PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-sleep-$(date +%s)-$$}"
WORKERS=(psql-sleeper-a psql-sleeper-b)

# As in lifecycle.sh: SQL on stdin, values passed with -v and quoted by psql (:'name').
sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q "$@" "$DSN"
}

expect() {
    if [[ "$2" != "$1" ]]; then
        echo "unexpected result of $3: got '$2', expected '$1'" >&2
        exit 1
    fi
}

# claim WORKER: one claim_and_start (claim + start in one call, attempt counted). Prints
# "run_id generation attempts step" for a claimed run (step from the recovery checkpoint, 0
# without one), nothing when no run is due.
claim() {
    sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$1" <<'SQL'
SELECT c.run_id, c.lease_generation, c.attempts, coalesce(c.checkpoint_data ->> 'step', '0')
  FROM zeroth.claim_and_start(deployment_ref => :'deployment', worker_id => :'worker',
                              lease_seconds  => 60) c
 WHERE c.run_id IS NOT NULL;
SQL
}

echo "deployment $DEPLOYMENT"

RUN_ID=$(sql -v deployment="$DEPLOYMENT" <<'SQL'
SELECT run_id FROM zeroth.enqueue_run(deployment_ref => :'deployment',
                                      payload        => '{"steps": 3}', max_attempts => 1);
SQL
)
echo "enqueued $RUN_ID"

PREVIOUS_GEN=''
for ROUND in 0 1 2 3; do
    WORKER="${WORKERS[$((ROUND % 2))]}"
    # Poll as a worker does between wakeups: a sleeping run is not due, so nothing notifies it;
    # the next claim after T finds it.
    CLAIMED=''
    for _ in $(seq 1 300); do
        CLAIMED=$(claim "$WORKER")
        [[ -n "$CLAIMED" ]] && break
        sleep 0.1
    done
    [[ -n "$CLAIMED" ]] || { echo "round $ROUND: nothing to claim after 30 s" >&2; exit 1; }
    read -r CLAIMED_ID GENERATION ATTEMPTS STEP <<< "$CLAIMED"
    expect "$RUN_ID" "$CLAIMED_ID" "claim_and_start"
    echo "round $ROUND: $WORKER claimed generation $GENERATION attempt $ATTEMPTS at step $STEP"

    if [[ -n "$PREVIOUS_GEN" && "$ROUND" == 1 ]]; then
        # The holder of the previous generation wakes up and tries to sleep: refused (outcome
        # NULL), nothing changes — the fence is in the UPDATE, like every other write.
        STALE=$(sql -v run_id="$RUN_ID" -v worker="${WORKERS[0]}" -v gen="$PREVIOUS_GEN" <<'SQL'
SELECT coalesce(s.outcome, 'refused')
  FROM zeroth.sleep_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                        delay_seconds => 60, checkpoint => '{"step": 99}') s;
SQL
)
        expect refused "$STALE" "stale sleep_run"
        echo "stale generation $PREVIOUS_GEN: sleep_run -> $STALE"
    fi

    if (( STEP < 3 )); then
        # ... the work of step $STEP would be done here ...
        read -r OUTCOME RESUME_AT < <(sql -F ' ' -v run_id="$RUN_ID" -v worker="$WORKER" \
            -v gen="$GENERATION" -v next="$((STEP + 1))" <<'SQL'
SELECT s.outcome, to_char(s.run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
  FROM zeroth.sleep_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                        delay_seconds => 1, checkpoint => jsonb_build_object('step', :next)) s;
SQL
)
        expect sleeping "$OUTCOME" "sleep_run"
        echo "round $ROUND: sleeping until $RESUME_AT with checkpoint step $((STEP + 1))"
        PREVIOUS_GEN="$GENERATION"
    else
        OK=$(sql -v run_id="$RUN_ID" -v worker="$WORKER" -v gen="$GENERATION" <<'SQL'
SELECT zeroth.complete_run(run_id => :'run_id', worker_id => :'worker', generation => :gen,
                           output => '{"steps_done": 3}');
SQL
)
        expect t "$OK" "complete_run"
        echo "round $ROUND: completed: complete_run -> $OK"
    fi
done

sql -F ' ' -v run_id="$RUN_ID" <<'SQL'
SELECT 'final', r.status, 'attempts', r.attempts, 'generation', r.lease_generation,
       'checkpoints', (SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = r.run_id)
  FROM zeroth.runs r
 WHERE r.run_id = :'run_id';
SQL
