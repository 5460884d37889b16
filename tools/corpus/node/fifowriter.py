# Feeds the corpus's Node server its FIFO: opens it (once a reader has),
# waits 5 ms, writes a line, closes; over and over.
import os, signal, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
while True:
    fd = os.open(sys.argv[1], os.O_WRONLY)
    time.sleep(0.005)
    try:
        os.write(fd, b"x\n")
    except BrokenPipeError:
        pass
    os.close(fd)
