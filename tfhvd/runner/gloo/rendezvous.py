"""The rendezvous server of a Gloo job: a small HTTP key-value store.

Workers reach it at ``HOROVOD_GLOO_RENDEZVOUS_ADDR:HOROVOD_GLOO_RENDEZVOUS_PORT``
through the C++ ``HttpStore`` (tfhvd_ops/backends/gloo/http_store.h), which
implements Gloo's rendezvous ``Store`` on top of three requests:

* ``PUT /<scope>/<key>`` stores the body (``?exclusive=1``: 409 if the key
  exists, which is how a second process claiming the same rank is caught);
* ``GET /<scope>/<key>?wait_ms=N`` answers the value, waiting up to N ms for a
  key that is not there yet (long poll, so waiting workers sleep), else 404;
* ``DELETE /<scope>`` forgets a scope.

Every ``hvd.init()`` uses its own scope (``init<N>``, or the
``HOROVOD_GLOO_SCOPE`` an elastic driver sets), so one server serves many
worlds in turn.  :class:`RendezvousServer` is usable on its own by a driver.

Every request is signed with the job's secret (:mod:`tfhvd.common.secret`);
the server (:mod:`tfhvd.runner.guarded_http`) answers anything else 403 and
keeps nothing of it, and bounds what it reads (docs/security.md).
"""

import threading
import urllib.error
import urllib.parse
from typing import Dict, Optional, TextIO, Tuple

from tfhvd.runner.guarded_http import GuardedHandler, GuardedServer
from tfhvd.common.secret import job_secret, secret_from_env, signed_urlopen

_MAX_WAIT_MS = 60_000


class KVStore:
    """The scoped key-value table, with waiting for keys."""

    def __init__(self) -> None:
        self._data: Dict[str, Dict[str, bytes]] = {}
        self._cond = threading.Condition()

    def put(self, scope: str, key: str, value: bytes, exclusive: bool = False) -> bool:
        """Stores a value; False (nothing stored) when ``exclusive`` and it exists."""
        with self._cond:
            table = self._data.setdefault(scope, {})
            if exclusive and key in table:
                return False
            table[key] = value
            self._cond.notify_all()
            return True

    def get(self, scope: str, key: str, wait_s: float = 0.0) -> Optional[bytes]:
        """The value, waiting up to ``wait_s`` for it; None if it never came."""
        with self._cond:
            self._cond.wait_for(lambda: key in self._data.get(scope, {}), timeout=wait_s)
            return self._data.get(scope, {}).get(key)

    def items(self, scope: str) -> Dict[str, bytes]:
        """A copy of one scope's keys and values (for drivers on this host)."""
        with self._cond:
            return dict(self._data.get(scope, {}))

    def delete_scope(self, scope: str) -> None:
        with self._cond:
            self._data.pop(scope, None)

    def scopes(self) -> Dict[str, int]:
        """Scope names and how many keys each holds (for tests and drivers)."""
        with self._cond:
            return {s: len(t) for s, t in self._data.items()}


def _split(path: str) -> Tuple[str, str, Dict[str, str]]:
    parsed = urllib.parse.urlsplit(path)
    parts = urllib.parse.unquote(parsed.path).lstrip("/").split("/", 1)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    return parts[0], (parts[1] if len(parts) > 1 else ""), query


class _Handler(GuardedHandler):
    server: "_Server"
    protocol_version = "HTTP/1.0"

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        value = self.signed_body()
        if value is None:
            return
        scope, key, query = _split(self.path)
        if not scope or not key:
            self.reply(400)
            return
        ok = self.server.store.put(scope, key, value, exclusive=query.get("exclusive") == "1")
        self.reply(200 if ok else 409)

    def do_GET(self) -> None:  # noqa: N802
        if self.signed_body() is None:
            return
        scope, key, query = _split(self.path)
        try:
            wait_ms = min(max(int(query.get("wait_ms", "0")), 0), _MAX_WAIT_MS)
        except ValueError:
            self.reply(400)
            return
        value = self.server.store.get(scope, key, wait_ms / 1000.0)
        if value is None:
            self.reply(404)
        else:
            self.reply(200, value)

    def do_DELETE(self) -> None:  # noqa: N802
        if self.signed_body() is None:
            return
        scope, _, _ = _split(self.path)
        self.server.store.delete_scope(scope)
        self.reply(200)


class _Server(GuardedServer):
    def __init__(self, addr: Tuple[str, int], store: KVStore, secret: str,
                 log: Optional[TextIO]) -> None:
        self.store = store
        super().__init__(addr, _Handler, secret, "the rendezvous server", log=log)


class RendezvousServer:
    """An HTTP key-value server on a thread of this process.

    ``start()`` returns the port (``port=0``: any free one); ``stop()`` ends
    it.  Usable as a context manager.  Every request must be signed with
    ``secret`` (default: :func:`~tfhvd.common.secret.job_secret`, the user's
    TFHVD_SECRET_KEY or a random one), which ranks get through
    :func:`~tfhvd.common.secret.secret_env`; others get 403.  It binds to
    ``host`` only: the launchers give loopback to one-host jobs.  Refused
    requests are reported on ``log`` (default stderr), the first one only.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 secret: Optional[str] = None, log: Optional[TextIO] = None) -> None:
        self.store = KVStore()
        self.secret = secret or job_secret()
        self._addr = (host, port)
        self._log = log
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the rendezvous server is not started")
        return int(self._server.server_address[1])

    @property
    def refused(self) -> int:
        """How many requests were refused so far."""
        return self._server.refusals.count if self._server is not None else 0

    def start(self) -> int:
        self._server = _Server(self._addr, self.store, self.secret, self._log)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.5},
                                        name="tfhvd-rendezvous", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "RendezvousServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _request(method: str, addr: str, port: int, path: str, body: bytes,
             secret: Optional[str], timeout: float):
    return signed_urlopen(secret or secret_from_env() or "", "http://%s:%d" % (addr, port),
                          method, path, body, timeout=timeout)


def _path(scope: str, key: str) -> str:
    return "/%s/%s" % (urllib.parse.quote(scope), urllib.parse.quote(key))


def kv_put(addr: str, port: int, scope: str, key: str, value: bytes,
           timeout: float = 10.0, secret: Optional[str] = None) -> None:
    """Stores ``value`` under ``scope/key`` on the server at ``addr:port``,
    signed with ``secret`` (default: this process's TFHVD_SECRET_KEY)."""
    _request("PUT", addr, port, _path(scope, key), value, secret, timeout).close()


def kv_get(addr: str, port: int, scope: str, key: str, wait_ms: int = 0,
           timeout: float = 10.0, secret: Optional[str] = None) -> Optional[bytes]:
    """The value of ``scope/key``, waiting up to ``wait_ms`` for it (None:
    absent); signed like :func:`kv_put`."""
    path = "%s?wait_ms=%d" % (_path(scope, key), wait_ms)
    try:
        with _request("GET", addr, port, path, b"", secret, timeout + wait_ms / 1000.0) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
