// The main thread and a worker thread bounce a turn through Atomics.wait
// and Atomics.notify: every hand-off is a context switch, with
// JavaScript frames on both threads' stacks. Prints the wall time in ns.
// Usage: node pingpong.js ROUNDS.
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

function waitTurn(ia, me) {
  while (Atomics.load(ia, 0) !== me) Atomics.wait(ia, 0, 1 - me);
}

function pass(ia, to) {
  Atomics.store(ia, 0, to);
  Atomics.notify(ia, 0);
}

if (isMainThread) {
  const rounds = Number(process.argv[2] || 100000);
  const ia = new Int32Array(new SharedArrayBuffer(8));
  ia[1] = rounds;
  const w = new Worker(__filename, { workerData: ia });
  w.on('online', () => {
    const start = process.hrtime.bigint();
    for (let i = 0; i < rounds; i++) {
      pass(ia, 1);
      waitTurn(ia, 0);
    }
    console.log(String(process.hrtime.bigint() - start));
  });
} else {
  const ia = workerData;
  for (let i = 0; i < ia[1]; i++) {
    waitTurn(ia, 1);
    pass(ia, 0);
  }
}
