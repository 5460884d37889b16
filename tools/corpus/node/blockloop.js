// An HTTP server whose handlers block its event loop: /readsync opens a
// FIFO and reads it synchronously (fs.openSync, fs.readSync) while
// another process writes it, /exec runs a child (execSync), / answers at
// once. Usage: node blockloop.js PORT FIFO; prints "ready".
'use strict';
const http = require('http');
const fs = require('fs');
const cp = require('child_process');

const [port, fifo] = process.argv.slice(2);
const buf = Buffer.alloc(64);

function readSync() {
  const fd = fs.openSync(fifo, 'r');
  try { return fs.readSync(fd, buf, 0, buf.length, null); } finally { fs.closeSync(fd); }
}

http.createServer((req, res) => {
  switch (req.url) {
    case '/readsync': res.end(String(readSync())); break;
    case '/exec': cp.execSync('sleep 0.01'); res.end('0'); break;
    default: res.end('ok');
  }
}).listen(+port, '127.0.0.1', () => console.log('ready'));
