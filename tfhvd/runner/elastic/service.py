"""The driver's HTTP endpoints for its workers (see :mod:`tfhvd.runner.elastic.worker`).

* ``POST /elastic/ready``  ``{"worker", "round"}``: blocks until the next world
  is formed; answers ``{"action": "run", "round", "rank", "size", ...,
  "fresh"}``, ``{"action": "leave"}`` or ``{"action": "abort", "message"}``.
* ``POST /elastic/notify`` ``{"worker", "round", "since", "wait"}``: long poll
  for host updates; answers ``{"seq", "update"}``.

:func:`handle_elastic` is the dispatch, so that any HTTP server of the
launcher can serve these paths; :class:`ElasticService` is a small threaded
server that serves only them.
"""

import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

from tfhvd.runner.elastic.driver import ElasticDriver
from tfhvd.runner.elastic.worker import TOKEN_HEADER

MAX_NOTIFY_WAIT_S = 60.0


def handle_elastic(driver: ElasticDriver, path: str,
                   body: Dict[str, Any]) -> Optional[Tuple[int, Dict[str, Any]]]:
    """``(status, answer)`` for an elastic path, or None for any other path."""
    if path == "/elastic/ready":
        return 200, driver.ready(str(body["worker"]), int(body["round"]))
    if path == "/elastic/notify":
        wait = min(float(body.get("wait", 30.0)), MAX_NOTIFY_WAIT_S)
        return 200, driver.wait_notification(str(body["worker"]), int(body["round"]),
                                             int(body.get("since", 0)), wait)
    return None


class ElasticService:
    """A threaded HTTP server for the elastic endpoints, on ``addr``:ephemeral port.

    Requests must carry ``token`` (given to workers as ``TFHVD_ELASTIC_TOKEN``);
    others get 403, so nothing else on the network can take part in the job.
    """

    def __init__(self, driver: ElasticDriver, addr: str = "0.0.0.0",
                 token: Optional[str] = None) -> None:
        self.driver = driver
        self.token = token or secrets.token_hex(16)
        expected = self.token.encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                given = (self.headers.get(TOKEN_HEADER) or "").encode()
                raw = self.rfile.read(length)
                if not hmac.compare_digest(given, expected):
                    self._send(403, {"error": "not a worker of this job"})
                    return
                result: Optional[Tuple[int, Dict[str, Any]]]
                try:
                    result = handle_elastic(driver, self.path, json.loads(raw.decode() or "{}"))
                except (ValueError, KeyError, TypeError) as e:
                    result = (400, {"error": "bad request: %s" % e})
                if result is None:
                    result = (404, {"error": "no such path %s" % self.path})
                self._send(*result)

            def _send(self, code: int, answer: Dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker exited (or reset) while it waited

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a worker that went away mid-request is not news

        self.server = Server((addr, 0), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="tfhvd-elastic-service")
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
