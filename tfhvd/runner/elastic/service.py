"""The driver's HTTP endpoints for its workers (see :mod:`tfhvd.common.elastic_worker`).

* ``POST /elastic/ready``  ``{"worker", "round"}``: blocks until the next world
  is formed; answers ``{"action": "run", "round", "rank", "size", ...,
  "fresh"}``, ``{"action": "leave"}`` or ``{"action": "abort", "message"}``.
* ``POST /elastic/notify`` ``{"worker", "round", "since", "wait"}``: long poll
  for host updates; answers ``{"seq", "update"}``.

:func:`handle_elastic` is the dispatch, so that any HTTP server of the
launcher can serve these paths; :class:`ElasticService` is a small threaded
server that serves only them.
"""

import json
import threading
from typing import Any, Dict, Optional, TextIO, Tuple

from tfhvd.runner.elastic.driver import ElasticDriver
from tfhvd.runner.guarded_http import GuardedHandler, GuardedServer
from tfhvd.common.secret import job_secret

MAX_NOTIFY_WAIT_S = 60.0
MAX_BODY = 1 << 20  # a worker's request is a few dozen bytes of JSON


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


class _Handler(GuardedHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        raw = self.signed_body()
        if raw is None:
            return
        result: Optional[Tuple[int, Dict[str, Any]]]
        try:
            body = json.loads(raw.decode() or "{}")
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            result = handle_elastic(self.server.driver, self.path, body)
        except (ValueError, KeyError, TypeError) as e:
            result = (400, {"error": "bad request: %s" % e})
        if result is None:
            result = (404, {"error": "no such path %s" % self.path})
        self.reply(result[0], json.dumps(result[1]).encode(), "application/json")


class _Server(GuardedServer):
    def __init__(self, addr: Tuple[str, int], driver: ElasticDriver, secret: str,
                 log: Optional[TextIO]) -> None:
        self.driver = driver
        super().__init__(addr, _Handler, secret, "the elastic driver's service",
                         max_body=MAX_BODY, log=log)


class ElasticService:
    """A threaded HTTP server for the elastic endpoints, on ``addr``:ephemeral port.

    Requests must be signed with ``secret`` (the job's, given to workers as
    TFHVD_SECRET_KEY; default: :func:`~tfhvd.common.secret.job_secret`);
    others get 403, so nothing else on the network can take part in the
    job.  Bodies over 1 MiB, slow clients and floods are refused as by the
    rendezvous server (:mod:`tfhvd.runner.guarded_http`).
    """

    def __init__(self, driver: ElasticDriver, addr: str = "127.0.0.1",
                 secret: Optional[str] = None, log: Optional[TextIO] = None) -> None:
        self.driver = driver
        self.secret = secret or job_secret()
        self.server = _Server((addr, 0), driver, self.secret, log)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True,
                                        name="tfhvd-elastic-service")
        self._thread.start()

    @property
    def refused(self) -> int:
        """How many requests were refused so far."""
        return self.server.refusals.count

    def stop(self) -> None:
        self.server.shutdown()
        self.server.close()
