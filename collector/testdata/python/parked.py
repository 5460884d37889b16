# A thread blocked since before any recording: it says it is about to
# park, then sleeps until killed.
import sys
import time


def parked():
    print("parked", flush=True)
    time.sleep(600)


parked()
