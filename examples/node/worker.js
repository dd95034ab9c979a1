#!/usr/bin/env node
// A zeroth_pg worker in Node.js with the `pg` package and nothing else: the SQL functions in
// schema `zeroth` are the whole API, so any language with a PostgreSQL driver can be a worker.
//
// The loop (zeroth_pg.RunWorker does the same in Python):
//   1. claim a batch: orphans first (claim_orphaned: running runs whose worker died, handed over
//      with their latest checkpoint), then pending runs (claim_pending, batch_size);
//   2. run the batch concurrently: start_run, then per step save_checkpoint (fenced), then
//      complete_run; a failing attempt is failed as retryable (fail_run: a retry with backoff, or
//      a dead letter once max_attempts attempts have failed);
//   3. one timer renews every held lease with a single renew_leases call every lease/3 seconds;
//      a cancel requested with request_cancel comes back on that renewal and the run ends with
//      cancel_run;
//   4. nothing to claim: say so on the dedicated LISTEN connection (announce_idle takes the
//      scope's wakeup-gate stripes; writers NOTIFY zeroth_wakeup only while a worker holds them)
//      and claim once more if it got a stripe it did not have; then wait --poll seconds, or less
//      when a NOTIFY arrives (or 5 ms doubling while another session holds some stripes). Work
//      found again: announce_busy. NOTIFY is only a hint: polling alone is always correct.
// SIGTERM / SIGINT stop it gracefully: runs in hand go back to pending with their checkpoints
// (hand_back_to_pending), claimed runs not started are released (release_lease).
//
// The demo handler: payload {"steps": N, "fail_attempts": K} asks for N steps (default 3) and for
// the first K attempts to fail (default 0); a recovered run resumes after its latest checkpoint.
//
// Usage:
//   npm install pg    (or: npm install --prefix examples/node)
//   node examples/node/worker.js [--until-empty] [--batch N] [--poll S] [--lease S] DSN
//   DATABASE_URL=postgresql://... node examples/node/worker.js
// Environment: DEPLOYMENT (default node-demo), TENANT, WORKSPACE, WORKER_ID, STEP_SECONDS
// (default 0), RETRY_BASE_SECONDS (default 1); PG* variables (PGOPTIONS, ...) as for libpq.
//
// Calls go through a pool with unnamed statements, so they work through PgBouncer in transaction
// mode; the LISTEN connection must be a direct or session-mode connection.
'use strict';

const { Client, Pool } = require('pg');

function parseArgs(argv) {
  const opts = { untilEmpty: false, batch: 10, poll: 1, lease: 30, dsn: process.env.DATABASE_URL };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--until-empty') opts.untilEmpty = true;
    else if (['--batch', '--poll', '--lease'].includes(arg)) opts[arg.slice(2)] = Number(argv[++i]);
    else if (arg.startsWith('-')) usage(`unknown option ${arg}`);
    else opts.dsn = arg;
  }
  if (!opts.dsn) usage('no DSN');
  return opts;
}

function usage(why) {
  console.error(`${why}\nusage: worker.js [--until-empty] [--batch N] [--poll SECONDS] ` +
                '[--lease SECONDS] DSN (or set DATABASE_URL)');
  process.exit(2);
}

const opts = parseArgs(process.argv.slice(2));
const deployment = process.env.DEPLOYMENT || 'node-demo';
const worker = process.env.WORKER_ID || `node-${require('os').hostname()}-${process.pid}`;
const tenant = process.env.TENANT || null;
const workspace = process.env.WORKSPACE || null;
const stepMs = 1000 * Number(process.env.STEP_SECONDS || 0);
const retryBase = Number(process.env.RETRY_BASE_SECONDS || 1);

const pool = new Pool({ connectionString: opts.dsn, max: opts.batch + 2 });
const held = new Map(); // run_id -> {generation, cancel}
let stopping = false;
let wake = null; // set while the loop waits for work: ends the wait early

// Wait up to `ms`, or until wake() is called (a NOTIFY, or a signal).
function idle(ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      wake = null;
      resolve();
    }
    wake = done;
  });
}

const log = (line) => console.log(line);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Every call names its arguments (named notation) and the scope; $1.. are bound by the driver.
async function value(sql, params) {
  const { rows } = await pool.query(sql, params);
  return rows.length ? Object.values(rows[0])[0] : null;
}

const CLAIM_COLUMNS =
  'c.run_id, c.lease_generation, c.status, c.attempts, c.payload, c.checkpoint_data';

async function claim(limit) {
  const scope = [deployment, worker, tenant, workspace, limit, opts.lease];
  const orphans = await pool.query(
    `SELECT ${CLAIM_COLUMNS} FROM zeroth.claim_orphaned(deployment_ref => $1, worker_id => $2,
         tenant_id => $3, workspace_id => $4, claim_limit => $5, lease_seconds => $6) c
      WHERE c.run_id IS NOT NULL`, scope);
  if (orphans.rows.length >= limit) return orphans.rows;
  scope[4] = limit - orphans.rows.length;
  const pending = await pool.query(
    `SELECT ${CLAIM_COLUMNS} FROM zeroth.claim_pending(deployment_ref => $1, worker_id => $2,
         tenant_id => $3, workspace_id => $4, batch_size => $5, lease_seconds => $6) c
      WHERE c.run_id IS NOT NULL`, scope);
  return orphans.rows.concat(pending.rows);
}

// One renew_leases call for every held run; a refused renewal (renewed false) or a cancel request
// is noted on the run, whose handler reacts at its next step. renewed NULL is not a refusal: the
// run's row was busy (this worker's own checkpoint of it in flight on another connection, an
// application's cancel in an open transaction) and the lease is still held: the next renewal tries
// again. A lease that runs out meanwhile is refused by the next renewal (renewed false) or
// checkpoint, and every write after its expiry is refused by the fence; this example keeps no
// local deadline (the Python RunWorker does), so a handler with effects outside the database
// should check its lease's expiry itself.
async function renewAll() {
  if (held.size === 0) return;
  const ids = [...held.keys()];
  const { rows } = await pool.query(
    `SELECT l.run_id, l.renewed, l.cancel_requested
       FROM zeroth.renew_leases(worker_id => $1, run_ids => $2::uuid[], generations => $3::bigint[],
                                tenant_id => $4, workspace_id => $5, lease_seconds => $6) l`,
    [worker, ids, ids.map((id) => held.get(id).generation), tenant, workspace, opts.lease]);
  for (const row of rows) {
    const run = held.get(row.run_id);
    if (run && row.renewed === false) run.lost = true;
    if (run && row.cancel_requested) run.cancel = true;
  }
}

async function fenced(fn, run, extra = '', params = []) {
  return value(
    `SELECT zeroth.${fn}(run_id => $1, worker_id => $2, generation => $3, tenant_id => $4,
                         workspace_id => $5${extra})`,
    [run.run_id, worker, run.lease_generation, tenant, workspace, ...params]);
}

async function processRun(run) {
  const state = { generation: run.lease_generation, cancel: false, lost: false };
  held.set(run.run_id, state);
  try {
    if (stopping) {
      await fenced('release_lease', run);
      return log(`stopping: released ${run.run_id}`);
    }
    if (!(await fenced('start_run', run))) {
      return log(`lease lost on ${run.run_id} before it started`);
    }
    const attempt = run.attempts + (run.status === 'pending' ? 1 : 0);
    const steps = run.payload.steps ?? 3;
    let step = run.checkpoint_data?.step ?? 0;
    const resumedFrom = step;
    log(`started ${run.run_id} generation ${run.lease_generation} attempt ${attempt} ` +
        `(resuming after step ${step})`);

    if (attempt <= (run.payload.fail_attempts ?? 0)) {
      const outcome = await fenced('fail_run', run,
        ', error => $6, retryable => true, retry_base_seconds => $7',
        [{ message: 'simulated transient failure', attempt }, retryBase]);
      return log(`failed ${run.run_id} attempt ${attempt}: ${outcome ?? 'lease lost'}`);
    }
    while (step < steps) {
      if (state.cancel) {
        const ok = await fenced('cancel_run', run);
        return log(`cancelled ${run.run_id} after step ${step}: ${ok}`);
      }
      if (stopping) {
        const ok = await fenced('hand_back_to_pending', run);
        return log(`stopping: handed back ${run.run_id} after step ${step}: ${ok}`);
      }
      if (state.lost) return log(`lease lost on ${run.run_id} at step ${step}`);
      await sleep(stepMs);
      step += 1;
      const id = await fenced('save_checkpoint', run, ', data => $6', [{ step }]);
      if (id === null) return log(`lease lost on ${run.run_id} at step ${step}`);
      log(`checkpoint ${run.run_id} step ${step}`);
    }
    const ok = await fenced('complete_run', run, ', output => $6',
                            [{ steps, resumed_from: resumedFrom, attempt, worker }]);
    log(`completed ${run.run_id}: ${ok}`);
  } finally {
    held.delete(run.run_id);
  }
}

async function listen() {
  const client = new Client({ connectionString: opts.dsn });
  await client.connect();
  // Payloads are opaque keys (anyone can NOTIFY and LISTEN): ask the database which one means
  // "work for this deployment", and treat a match as a hint only.
  const { rows } = await client.query(
    'SELECT zeroth.wakeup_key(deployment_ref => $1) AS key', [deployment]);
  const key = rows[0].key;
  client.on('notification', (msg) => {
    if (wake && msg.payload === key) {
      log(`woken by ${msg.channel}`);
      wake();
    }
  });
  await client.query('LISTEN zeroth_wakeup');
  return client;
}

// The wakeup gate (sql/README.md): the stripes this LISTEN session holds, and the backoff while
// it holds fewer than all eight.
const gate = { held: [], retry: 5 };

async function announceIdle(listener) {
  const { rows } = await listener.query(
    'SELECT zeroth.announce_idle(deployment_ref => $1) AS held', [deployment]);
  const gained = rows[0].held.some((stripe) => !gate.held.includes(stripe));
  gate.held = rows[0].held;
  if (gained) gate.retry = 5;
  return gained;
}

async function announceBusy(listener) {
  if (gate.held.length === 0) return;
  gate.held = [];
  gate.retry = 5;
  await listener.query('SELECT zeroth.announce_busy(deployment_ref => $1)', [deployment]);
}

function idleWait() {
  if (gate.held.length === 8) return opts.poll * 1000;
  const wait = Math.min(opts.poll * 1000, gate.retry);
  gate.retry = Math.min(opts.poll * 1000, gate.retry * 2);
  return wait;
}

async function main() {
  const listener = await listen();
  const renew = () => renewAll().catch((err) => log(`renewal failed: ${err.message}`));
  const renewer = setInterval(renew, (opts.lease * 1000) / 3);
  const stop = () => {
    stopping = true;
    if (wake) wake();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  log(`worker ${worker} serving deployment ${deployment} ` +
      `(batch ${opts.batch}, lease ${opts.lease}s)`);
  try {
    while (!stopping) {
      const runs = await claim(opts.batch);
      if (runs.length === 0) {
        if (opts.untilEmpty) {
          log('queue empty: exiting (--until-empty)');
          break;
        }
        // A stripe gained: its writer did not notify and has committed; look once more.
        if (await announceIdle(listener)) continue;
        log('waiting for work');
        await idle(idleWait());
        continue;
      }
      await announceBusy(listener);
      for (const run of runs) log(`claimed ${run.run_id} generation ${run.lease_generation}`);
      await Promise.all(runs.map(processRun));
    }
    if (stopping) log('stopped');
  } finally {
    clearInterval(renewer);
    await listener.end();
    await pool.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
