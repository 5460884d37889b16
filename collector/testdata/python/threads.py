"""Threads whose waits offcpu must tell apart (collector/python_test.go).

py-cpu-1, py-cpu-2: pure-Python loops: they wait for the GIL, held by
each other. py-holder sleeps holding a threading.Lock that py-lockwait
waits for in acquire (its own clock counts the time). py-queue waits in
queue.Queue.get for an item py-producer puts once a second: idle.
Writes its own figures as JSON to argv[2] after argv[1] seconds.
"""
import ctypes
import json
import queue
import sys
import threading
import time

libc = ctypes.CDLL(None)
duration = float(sys.argv[1])
out = sys.argv[2]
stop = time.monotonic() + duration
tids = {}
acquire_s = [0.0]


def named(name):
    libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's comm
    tids[name] = threading.get_native_id()


def spin(name):
    named(name)
    x = 0
    while time.monotonic() < stop:
        for i in range(20000):
            x += i * i


lock = threading.Lock()


def hold():
    named("py-holder")
    while time.monotonic() < stop:
        with lock:
            time.sleep(0.2)
        time.sleep(0.005)


def wait_for_lock():
    named("py-lockwait")
    time.sleep(0.05)
    while time.monotonic() < stop:
        t0 = time.monotonic()
        lock.acquire()
        acquire_s[0] += time.monotonic() - t0
        lock.release()
        time.sleep(0.001)


work = queue.Queue()


def consume():
    named("py-queue")
    while True:
        item = work.get()
        if item is None:
            return


def produce():
    named("py-producer")
    while time.monotonic() < stop:
        time.sleep(1)
        work.put(1)
    work.put(None)


threads = [threading.Thread(target=spin, args=("py-cpu-1",)), threading.Thread(target=spin, args=("py-cpu-2",)),
           threading.Thread(target=hold), threading.Thread(target=wait_for_lock),
           threading.Thread(target=consume), threading.Thread(target=produce)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump({"acquire_s": acquire_s[0], "tids": tids}, f)
