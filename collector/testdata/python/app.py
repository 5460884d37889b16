"""A WSGI app for gunicorn (collector/python_test.go): each request does
some pure-Python work and waits 2 ms, as a handler that calls a backend."""
import time

BODY = b"x" * 64


def app(environ, start_response):
    total = 0
    for i in range(3000):
        total += i * i
    time.sleep(0.002)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]
