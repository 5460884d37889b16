import socket, threading, time, sys
def run(c):
    s = socket.create_connection(("127.0.0.1", 18211)); f = s.makefile("rb"); end = time.time() + 1.2; i = 0
    while time.time() < end:
        k = b"k%d-%d" % (c, i % 500); i += 1
        s.sendall(b"set %s 0 0 100\r\n%s\r\nget %s\r\n" % (k, b"v" * 100, k))
        for _ in range(4): f.readline()
ts = [threading.Thread(target=run, args=(c,)) for c in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
