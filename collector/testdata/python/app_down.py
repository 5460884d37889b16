"""A WSGI app whose handler calls a downstream HTTP service (urllib, a
socket with a timeout: CPython waits in poll())."""
import os, urllib.request
DOWN = "http://127.0.0.1:%s/" % os.environ.get("DOWN_PORT", "18081")
BODY = b"x" * 64
def app(environ, start_response):
    with urllib.request.urlopen(DOWN, timeout=5) as r:
        r.read()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
    return [BODY]
