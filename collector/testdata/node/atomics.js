// Two worker threads wait in Atomics.wait: one for a lock the main thread
// holds 10 ms at a time (woken by its unlock), one for jobs the main
// thread posts (woken by postJob). Usage: node atomics.js ROUNDS.
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

const LOCK = 0, JOB = 1, DONE = 2;

if (isMainThread) {
  const rounds = Number(process.argv[2] || 30);
  const ia = new Int32Array(new SharedArrayBuffer(16));
  const workers = [new Worker(__filename, { workerData: { ia, role: 'locker' } }),
                   new Worker(__filename, { workerData: { ia, role: 'jobs' } })];
  function lock() { while (Atomics.compareExchange(ia, LOCK, 0, 1) !== 0) Atomics.wait(ia, LOCK, 1, 5); }
  function unlock() { Atomics.store(ia, LOCK, 0); Atomics.notify(ia, LOCK); }
  function postJob() { Atomics.add(ia, JOB, 1); Atomics.notify(ia, JOB); }
  let n = 0;
  function round() {
    lock();
    const t = Date.now();
    while (Date.now() - t < 10) {}
    unlock();
    postJob();
    if (++n < rounds) { setTimeout(round, 10); return; }
    Atomics.store(ia, DONE, 1);
    postJob();
    unlock();
    Promise.all(workers.map((w) => new Promise((r) => w.on('exit', r)))).then(() => console.log('done'));
  }
  setTimeout(round, 200);
} else {
  const { ia, role } = workerData;
  function acquire() {
    while (Atomics.compareExchange(ia, LOCK, 0, 1) !== 0) {
      if (Atomics.load(ia, DONE)) return false;
      Atomics.wait(ia, LOCK, 1, 1000);
    }
    Atomics.store(ia, LOCK, 0);
    Atomics.notify(ia, LOCK);
    return true;
  }
  function waitForJob(seen) {
    while (Atomics.load(ia, JOB) === seen) Atomics.wait(ia, JOB, seen, 1000);
    return Atomics.load(ia, JOB);
  }
  let seen = 0;
  while (!Atomics.load(ia, DONE)) {
    if (role === 'locker') {
      acquire();
      Atomics.wait(ia, DONE, 0, 2); // let the main thread take it again
    } else {
      seen = waitForJob(seen);
    }
  }
}
