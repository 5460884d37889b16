# A WSGI app for the corpus's gunicorn: answers at once.
def app(environ, start_response):
    body = b"ok\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
