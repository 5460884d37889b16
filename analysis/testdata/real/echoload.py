import socket, threading, time, sys
port = int(sys.argv[1]); dur = float(sys.argv[2])
def run():
    s = socket.create_connection(("127.0.0.1", port)); end = time.time() + dur
    while time.time() < end:
        s.sendall(b"x" * 64); got = 0
        while got < 64: got += len(s.recv(64 - got))
ts = [threading.Thread(target=run) for _ in range(8)]; [t.start() for t in ts]; [t.join() for t in ts]
