"""An HTTP server for a job's endpoints that strangers cannot use or stall.

:class:`GuardedServer` and :class:`GuardedHandler` are what the rendezvous
store (:mod:`tfhvd.runner.gloo.rendezvous`) and the elastic service
(:mod:`tfhvd.runner.elastic.service`) are built on:

* **signed requests only**: :meth:`GuardedHandler.signed_body` checks the
  request's signature (:mod:`tfhvd.common.secret`) before it reads a byte of
  the body; anything else gets 403 and the connection is closed, so nothing
  of it is stored or acted on;
* **bounded input**: a request line and headers must arrive within
  :data:`HEAD_TIMEOUT_S` (a client sending a byte a second is cut off), a
  body is at most ``max_body`` bytes, and at most ``max_connections``
  connections are served at once (more are closed at once, without a
  thread), so a flood cannot exhaust threads or memory;
* **refusals logged once**: the first refused request is reported with its
  reason and client; later ones are counted, and :meth:`GuardedServer.close`
  reports the count.
"""

import io
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional, TextIO, Tuple

from tfhvd.common.secret import ReplayGuard, body_matches, check_head

HEAD_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 120.0
MAX_BODY = 256 << 20
MAX_CONNECTIONS = 256


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, each read bounded by the handler's current deadline
    (so a slow client cannot hold a thread longer than that in all)."""

    def __init__(self, sock: socket.socket, handler: "GuardedHandler") -> None:
        super().__init__()
        self._sock, self._handler = sock, handler

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client was too slow")
        self._sock.settimeout(left)
        return self._sock.recv_into(buf)


class RefusalLog:
    """Reports the first refused request of a server; counts the others."""

    def __init__(self, name: str, stream: Optional[TextIO] = None) -> None:
        self.name, self._stream = name, stream
        self.count = 0
        self._lock = threading.Lock()

    def refuse(self, client: str, why: str) -> None:
        with self._lock:
            self.count += 1
            first = self.count == 1
        if first:
            out = self._stream or sys.stderr
            out.write("tfhvd: %s refused a request from %s (%s); further refusals are "
                      "counted, not logged\n" % (self.name, client, why))
            out.flush()

    def close(self) -> None:
        if self.count > 1:
            out = self._stream or sys.stderr
            out.write("tfhvd: %s refused %d requests in all\n" % (self.name, self.count))
            out.flush()


class GuardedServer(ThreadingHTTPServer):
    """A threaded HTTP server with a connection cap and a refusal log."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: Tuple[str, int], handler: Callable[..., Any], secret: str,
                 name: str, max_body: int = MAX_BODY,
                 max_connections: int = MAX_CONNECTIONS,
                 log: Optional[TextIO] = None) -> None:
        self.secret, self.max_body, self.max_connections = secret, max_body, max_connections
        self.replays = ReplayGuard()
        self.refusals = RefusalLog(name, log)
        self._active = 0
        self._active_lock = threading.Lock()
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            full = self._active >= self.max_connections
            if not full:
                self._active += 1
        if full:
            self.refusals.refuse(str(client_address[0]), "more than %d connections at once"
                                 % self.max_connections)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-request is not news

    def close(self) -> None:
        """Stops serving (if serving) and reports the refusals."""
        self.server_close()
        self.refusals.close()


class GuardedHandler(BaseHTTPRequestHandler):
    """Reads requests under a deadline; :meth:`signed_body` authenticates."""

    server: GuardedServer
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + HEAD_TIMEOUT_S
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + HEAD_TIMEOUT_S  # each request's head
        super().handle_one_request()

    def log_message(self, fmt: str, *args: Any) -> None:  # noqa: D102 - quiet
        pass

    def send_error(self, code: int, message: Optional[str] = None,
                   explain: Optional[str] = None) -> None:
        # A malformed request line or header (random bytes): counted as a refusal.
        self.server.refusals.refuse(self.client_address[0], "a malformed request (HTTP %d)"
                                    % code)
        self.close_connection = True
        try:
            super().send_error(code, message, explain)
        except OSError:
            pass

    def reply(self, code: int, body: bytes = b"", content_type: str = "") -> None:
        """Sends ``code`` with ``body``."""
        try:
            self.send_response(code)
            if content_type:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)
        except OSError:
            pass  # the client went away while it waited

    def unsupported(self) -> None:
        """A method this endpoint does not serve: 403 to a stranger, 405 to
        the job (subclasses override the ``do_*`` they serve)."""
        if self.signed_body() is not None:
            self.reply(405)

    do_GET = do_PUT = do_POST = do_DELETE = unsupported  # noqa: N815 - http.server's names

    def signed_body(self) -> Optional[bytes]:
        """The body of a correctly signed request, or None after answering
        403 (bad or missing signature), 413 (too large) or 400 (a body that is
        not the signed one) and closing the connection."""
        why = check_head(self.server.secret, self.command, self.path, self.headers,
                         self.server.replays)
        length = -1
        if why is None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                why = "a malformed Content-Length"
        if why is None and not 0 <= length <= self.server.max_body:
            self.server.refusals.refuse(self.client_address[0], "a body of %d bytes" % length)
            self.close_connection = True
            self.reply(413)
            return None
        if why is not None:
            self.server.refusals.refuse(self.client_address[0], why)
            self.close_connection = True
            self.reply(403)
            return None
        self.deadline = time.monotonic() + BODY_TIMEOUT_S
        try:
            body = self.rfile.read(length) if length else b""
        except (OSError, TimeoutError):
            body = None
        if body is None or len(body) != length:  # a sender that died or stalled mid-request
            why = "a body of %d of its %d bytes" % (len(body or b""), length)
        elif not body_matches(self.headers, body):
            why = "a body that does not match its signature"
        if why is not None:
            self.server.refusals.refuse(self.client_address[0], why)
            self.close_connection = True
            self.reply(400)
            return None
        return body
