// pg-boss as a peer of the zeroth_pg bench (bench/pgboss.py starts it; one process per cell).
//
//   node driver.js '{"dsn": "...", "mode": "continuous"|"depth", "seconds": 60,
//                    "concurrency": 32, "rate": 600, "depth": 4000, "drain": 30, "batch": 32}'
//
// The same shape as the bench's other peers: one process runs the producer and a consumer with
// W = concurrency handler slots (a 1 ms handler), on a fresh database (boss.start() installs its
// schema, the load begins at once). The slots are ceil(W / batch) `work()` loops of batchSize
// `batch`, whose handlers run at once; the bench passes batch = W, pg-boss's fastest shape of
// those measured (batch 1, 4, 16 and W: docs/performance-history.md, "Day one"). pg-boss 10 polls (pollingIntervalSeconds, 0.5 s at its minimum): a loop that
// found a job, and every loop after an enqueue, is woken with boss.notifyWorker(id), the
// documented way to skip the polling interval, so that its rate is not its poll interval.
//
//   continuous: every 10 ms, the jobs due by then at `rate`/s in one boss.insert(); then up to
//     `drain` seconds for the backlog.
//   depth: the queue topped up to `depth` created jobs (getQueueSize) with inserts of ≤ 500.
//
// Prints "ready" when the workers run, then one JSON line at the end: seconds since the
// producer's start at which each job's insert came back ("acked") and its handler started
// ("started"), how many were sent, and how many unhandled rejections pg-boss left ("unhandled").

'use strict'

const PgBoss = require('pg-boss')

const QUEUE = 'bench'
const TICK_MS = 10
const HANDLER_MS = 1

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// What a production pg-boss service installs: Node ends the process on an unhandled rejection,
// and pg-boss 10 leaves one when the server restarts under it (a pooled query of its own
// maintenance or fetch loop). Logged (the bench counts them) and survived.
let unhandled = 0
process.on('unhandledRejection', (err) => {
  unhandled++
  process.stderr.write(`unhandled rejection: ${(err && err.stack) || err}\n`)
})

async function main () {
  const cfg = JSON.parse(process.argv[2])
  const boss = new PgBoss({
    connectionString: cfg.dsn,
    max: cfg.concurrency + 4,
    pollingIntervalSeconds: 0.5
  })
  boss.on('error', (err) => process.stderr.write(`pg-boss error: ${err.message}\n`))
  await boss.start()
  await boss.createQueue(QUEUE)

  const acked = []
  const started = []
  const seen = new Set()
  let t0 = performance.now()
  const now = () => (performance.now() - t0) / 1000
  const workers = []

  // W handler slots as ceil(W / batch) work() loops that each fetch up to `batch` jobs in one
  // query, run their handlers at once and complete them in one query (batch 1: W loops of one).
  const batch = Math.max(1, Math.min(cfg.batch || 1, cfg.concurrency))
  for (let i = 0; i < Math.ceil(cfg.concurrency / batch); i++) {
    let id = null
    id = await boss.work(QUEUE, { batchSize: batch }, async (jobs) => {
      for (const job of jobs) {
        if (!seen.has(job.data.n)) {
          seen.add(job.data.n)
          started.push([job.data.n, now()])
        }
      }
      await Promise.all(jobs.map(() => sleep(HANDLER_MS)))
      if (jobs.length && id) boss.notifyWorker(id) // a job found: fetch again at once
    })
    workers.push(id)
  }
  const wake = () => { for (const id of workers) boss.notifyWorker(id) }
  process.stdout.write('ready\n')

  t0 = performance.now()
  let sent = 0
  const deadline = cfg.seconds
  while (now() < deadline) {
    let numbers = []
    if (cfg.mode === 'continuous') {
      const due = Math.floor(now() * cfg.rate)
      for (let n = sent; n < due; n++) numbers.push(n)
    }
    try {
      if (cfg.mode !== 'continuous') {
        const queued = await boss.getQueueSize(QUEUE)
        const room = Math.min(500, cfg.depth - queued)
        for (let n = sent; n < sent + Math.max(0, room); n++) numbers.push(n)
      }
      if (numbers.length) await boss.insert(numbers.map((n) => ({ name: QUEUE, data: { n } })))
    } catch (err) {
      // a restarted server: try again at the next tick
      process.stderr.write(`producer query failed: ${err.message}\n`)
      await sleep(50)
      continue
    }
    if (numbers.length) {
      const t = now()
      for (const n of numbers) acked.push([n, t])
      sent += numbers.length
      wake()
    }
    await sleep(cfg.mode === 'continuous' ? TICK_MS : (numbers.length ? 0 : 50))
  }
  if (cfg.mode === 'continuous') {
    const limit = performance.now() + 1000 * cfg.drain
    while (seen.size < sent && performance.now() < limit) await sleep(50)
  }
  await boss.stop({ graceful: false, wait: false, close: true })
  // process.exit() drops what a pipe has not taken yet (the line is megabytes): wait for it.
  await new Promise((resolve) => process.stdout.write(JSON.stringify({ sent, acked, started, unhandled }) + '\n', resolve))
  process.exit(0)
}

main().catch((err) => {
  process.stderr.write(`pg-boss driver failed: ${err.stack || err}\n`)
  process.exit(2)
})
