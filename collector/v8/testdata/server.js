// An HTTP server whose handlers block its event loop, each measuring the
// time it blocked: /fifo reads a FIFO its client feeds slowly
// (fs.readFileSync), /exec runs a child (child_process.execSync), /busy
// spins on the CPU. /pool reads a file through libuv's thread pool;
// /stats answers the totals, in ms. Usage: node server.js PORT FIFO
// EXEC_SECONDS; prints "ready" once it listens.
'use strict';
const http = require('http');
const fs = require('fs');
const cp = require('child_process');

const [port, fifo, execSeconds] = process.argv.slice(2);
const totals = { fifo: 0, exec: 0, busy: 0, requests: 0 };

function now() { return Number(process.hrtime.bigint()) / 1e6; }

function readFifo() {
  const t = now();
  const b = fs.readFileSync(fifo);
  totals.fifo += now() - t;
  return b.length;
}

function runChild() {
  const t = now();
  cp.execSync('sleep ' + execSeconds);
  totals.exec += now() - t;
  return 0;
}

function spin() {
  const t = now();
  let x = 0;
  while (now() - t < 20) x++;
  totals.busy += now() - t;
  return x;
}

function poolRead(res) {
  fs.readFile(__filename, (err, b) => res.end(String(err ? -1 : b.length)));
}

http.createServer((req, res) => {
  totals.requests++;
  switch (req.url) {
    case '/fifo': res.end(String(readFifo())); break;
    case '/exec': res.end(String(runChild())); break;
    case '/busy': res.end(String(spin())); break;
    case '/pool': poolRead(res); break;
    case '/stats': res.end(JSON.stringify(totals)); break;
    default: res.statusCode = 404; res.end();
  }
}).listen(Number(port), '127.0.0.1', () => console.log('ready'));
