"""redisclient.py PORT N OUT: starts redis-server on PORT (a child, so a
recorder that started this records it too), sends it N DEBUG SLEEP
commands of 1 to 3 ms over one connection, and writes to OUT one JSON
object per command: this thread's id, its CLOCK_MONOTONIC ns around the
command, and the duration Redis's own SLOWLOG gives it (µs)."""
import json
import random
import socket
import subprocess
import sys
import threading
import time

port, n, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--enable-debug-command", "local",
                           "--slowlog-log-slower-than", "0", "--slowlog-max-len", str(n + 100)],
                          stdout=subprocess.DEVNULL)


def command(sock, *args):
    msg = "*%d\r\n" % len(args) + "".join("$%d\r\n%s\r\n" % (len(a), a) for a in args)
    sock.sendall(msg.encode())
    return reply(sock.makefile("rb"))


def reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b"-", b":"):
        return rest.decode()
    if kind == b"$":
        return None if rest == b"-1" else f.read(int(rest) + 2)[:-2].decode()
    if kind == b"*":
        return [reply(f) for _ in range(int(rest))]
    raise ValueError(line)


for _ in range(200):
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        if command(sock, "PING") == "PONG":
            break
    except OSError:
        time.sleep(0.05)
command(sock, "SLOWLOG", "RESET")
rnd = random.Random(1)
times = []
for i in range(n):
    secs = "%.4f" % (0.001 + rnd.random() * 0.002)
    msg = ("*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$%d\r\n%s\r\n" % (len(secs), secs)).encode()
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    sock.sendall(msg)
    got = sock.recv(64)
    t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert got == b"+OK\r\n", got
    times.append((t0, t1, secs))
    time.sleep(0.001)
log = command(sock, "SLOWLOG", "GET", str(n + 100))
sleeps = sorted((e for e in log if e[3][:2] == ["DEBUG", "SLEEP"]), key=lambda e: int(e[0]))
assert len(sleeps) == n, (len(sleeps), n)
with open(out, "w") as f:
    for (t0, t1, secs), e in zip(times, sleeps):
        assert e[3][2] == secs
        f.write(json.dumps({"tid": threading.get_native_id(), "redis_pid": server.pid, "start": t0, "end": t1,
                            "slowlog_us": int(e[2])}) + "\n")
try:
    command(sock, "SHUTDOWN", "NOSAVE")
except (OSError, ValueError):
    pass
server.wait()
