#!/usr/bin/env bash
# Steps and an external event driven by nothing but psql: a run records one step, waits for an
# approval, and is resumed by zeroth.emit_event, the way a webhook or a person at psql would.
#
# A worker claims the run, records the step "fetch-profile" (zeroth.record_step: written once,
# fenced by the lease generation) and waits for the event "approval:<run_id>"
# (zeroth.wait_for_event): the event is not there, so the run leaves the worker (status waiting,
# lease and slot released, attempt given back). Then anyone granted zeroth_worker emits the event:
#
#   SELECT * FROM zeroth.emit_event(name => 'approval:<run_id>', payload => '{"by": "ann"}');
#
# which makes the run pending again. A second worker claims it, replays: the step is already
# recorded (get_step: found, no second call), and the wait now returns the payload, recorded as
# the wait's step result. A second emit changes nothing (first write wins).
#
# Usage:
#   examples/psql/steps_events.sh 'postgresql://user:pass@host/db'
#   DATABASE_URL='postgresql://...' examples/psql/steps_events.sh
# Environment:
#   PSQL        the psql binary to use (default: psql from PATH)
#   DEPLOYMENT  the deployment_ref to use (default: a fresh one per invocation)
#
# The database must have the zeroth schema installed (`zeroth-pg migrate`). The script writes one
# run and leaves it completed.

set -euo pipefail

DSN="${1:-${DATABASE_URL:-}}"
if [[ -z "$DSN" ]]; then
    echo "usage: $0 DSN   (or set DATABASE_URL)" >&2
    exit 2
fi
PSQL="${PSQL:-psql}"
DEPLOYMENT="${DEPLOYMENT:-psql-steps-$(date +%s)-$$}"

sql() {
    "$PSQL" -X -v ON_ERROR_STOP=1 -At -q "$@" "$DSN"
}

claim() {
    sql -F ' ' -v deployment="$DEPLOYMENT" -v worker="$1" <<'SQL'
SELECT c.run_id, c.lease_generation
  FROM zeroth.claim_and_start(deployment_ref => :'deployment', worker_id => :'worker',
                              lease_seconds  => 60) c
 WHERE c.run_id IS NOT NULL;
SQL
}

# drive WORKER RUN_ID GENERATION: the handler, replayed from the start on every attempt.
drive() {
    local found result outcome payload
    read -r found result < <(sql -F ' ' -v run="$2" -v worker="$1" -v gen="$3" <<'SQL'
SELECT step_found, coalesce(result::text, '-') FROM zeroth.get_step(run_id => :'run',
    worker_id => :'worker', generation => :gen, step_key => 'fetch-profile');
SQL
)
    if [[ "$found" == "t" ]]; then
        echo "$1: step fetch-profile already recorded: $result"
    else
        result=$(sql -v run="$2" -v worker="$1" -v gen="$3" <<'SQL'
SELECT recorded_result::text FROM zeroth.record_step(run_id => :'run', worker_id => :'worker',
    generation => :gen, step_key => 'fetch-profile', result => '{"name": "Ann"}');
SQL
)
        echo "$1: step fetch-profile ran and was recorded: $result"
    fi
    read -r outcome payload < <(sql -F ' ' -v run="$2" -v worker="$1" -v gen="$3" <<'SQL'
SELECT outcome, coalesce(payload::text, '-') FROM zeroth.wait_for_event(run_id => :'run',
    worker_id => :'worker', generation => :gen, step_key => '#event:approval',
    name => 'approval:' || :'run', timeout_seconds => 3600);
SQL
)
    echo "$1: wait_for_event -> $outcome $payload"
    if [[ "$outcome" == "received" ]]; then
        echo "$1: completed: $(sql -v run="$2" -v worker="$1" -v gen="$3" <<'SQL'
SELECT zeroth.complete_run(run_id => :'run', worker_id => :'worker', generation => :gen,
                           output => '{"approved": true}');
SQL
)"
    fi
}

echo "deployment $DEPLOYMENT"
RUN_ID=$(sql -v deployment="$DEPLOYMENT" <<'SQL'
SELECT run_id FROM zeroth.enqueue_run(deployment_ref => :'deployment');
SQL
)
echo "enqueued $RUN_ID"

read -r _ GEN < <(claim psql-steps-a)
drive psql-steps-a "$RUN_ID" "$GEN"
echo "status $(sql -v run="$RUN_ID" <<'SQL'
SELECT status || ' ' || wait_reason FROM zeroth.runs WHERE run_id = :'run';
SQL
)"

# The approval, from any session granted zeroth_worker (a webhook handler, a person at psql).
echo "emit: $(sql -F ' ' -v run="$RUN_ID" <<'SQL'
SELECT emitted, woken FROM zeroth.emit_event(name => 'approval:' || :'run',
                                             payload => '{"by": "ann"}');
SQL
)"
echo "emit again: $(sql -F ' ' -v run="$RUN_ID" <<'SQL'
SELECT emitted, woken FROM zeroth.emit_event(name => 'approval:' || :'run',
                                             payload => '{"by": "mallory"}');
SQL
)"

read -r _ GEN < <(claim psql-steps-b)
drive psql-steps-b "$RUN_ID" "$GEN"
