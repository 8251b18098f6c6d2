"""The compute service: where a tf.data service's dispatchers and workers
find each other and the training ranks (Horovod's
``horovod.runner.common.service.compute_service``).

A job that feeds training from ``tf.data.experimental.service`` has three
kinds of processes: the compute ranks (each runs a tf.data ``WorkerServer``),
one or more ``DispatchServer``\\ s (on the compute side or the training side),
and the training ranks.  :class:`ComputeService` is the small meeting point
they share; it knows no TensorFlow:

1. a process that starts dispatcher ``i`` registers its address
   (:meth:`ComputeClient.register_dispatcher`);
2. compute ranks and training ranks wait for that address
   (:meth:`ComputeClient.wait_for_dispatcher_registration`);
3. each compute rank, once its worker server runs, registers for its
   dispatcher (:meth:`ComputeClient.register_worker_for_dispatcher`);
4. a training rank waits until all workers of its dispatcher are there
   (:meth:`ComputeClient.wait_for_dispatcher_worker_registration`), then reads;
5. when training is done someone asks for shutdown
   (:meth:`ComputeClient.shutdown`); the compute ranks, blocked in
   :meth:`ComputeClient.wait_for_shutdown`, stop their workers, report it
   (:meth:`ComputeClient.register_worker_stopped`) and end; a dispatcher
   stops only after its workers did (:meth:`ComputeClient.wait_for_workers_stopped`),
   and a training-side dispatcher first releases its workers
   (:meth:`ComputeClient.release_dispatcher`).  A tf.data worker whose
   dispatcher has gone cannot stop before its retries time out, hence the order.

The service is an HTTP server (:class:`tfhvd.runner.guarded_http.GuardedServer`)
that answers only requests signed with the job's key
(:mod:`tfhvd.common.secret`).  It listens on loopback unless it is given a
network interface (``nics``) or ``TFHVD_BIND_ADDR``, so a one-host job is
never reachable from elsewhere.  The waits are long polls: each request
waits at most :data:`POLL_S` seconds on the server and the client asks
again, so a service that went away ends a waiting compute rank instead of
leaving it behind.
"""

import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from tfhvd.runner.common import bind_address, iface_address
from tfhvd.runner.guarded_http import GuardedHandler, GuardedServer
from tfhvd.common.secret import sign_request

NAME = "Compute service"
POLL_S = 10.0
LOOPBACK = "127.0.0.1"

Addresses = Mapping[str, Sequence[Tuple[str, int]]]


class TimeoutException(TimeoutError):
    """A wait on the compute service ran out of time (Horovod's
    ``horovod.runner.common.util.timeout.TimeoutException``)."""


_ERRORS = {"IndexError": IndexError, "ValueError": ValueError,
           "TimeoutException": TimeoutException}


def service_host(nics: Optional[Sequence[str]] = None,
                 env: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """``(interface name, address)`` a service of this host should listen on:
    the first of ``nics`` that has an IPv4 address, else loopback
    (``("lo", "127.0.0.1")``); ``TFHVD_BIND_ADDR`` overrides the address."""
    env = os.environ if env is None else env
    name, addr = "lo", LOOPBACK
    for nic in nics or ():
        found = iface_address(nic)
        if found:
            name, addr = nic, found
            break
    else:
        if nics:
            raise ValueError("none of the network interfaces %s has an IPv4 address on this "
                             "host" % list(nics))
    return name, bind_address(addr, env)


class _Handler(GuardedHandler):
    server: "_Server"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.signed_body()
        if body is None:
            return
        try:
            request = json.loads(body.decode() or "{}")
            answer = self.server.owner._handle(self.path.lstrip("/"), request)
        except Exception as e:  # noqa: BLE001 - every error goes back to the client
            answer = {"error": type(e).__name__, "message": str(e)}
        self.reply(200, json.dumps(answer).encode(), "application/json")


class _Server(GuardedServer):
    owner: "ComputeService"


class ComputeService:
    """Keeps the dispatchers' addresses and their workers' registrations for
    ``dispatchers`` dispatchers of ``workers_per_dispatcher`` workers each.

    ``key`` (bytes) signs every request; ``nics``: the interface to listen
    on (default loopback: a one-host job).  ``fault_tolerant`` is accepted
    for Horovod's signature: a dispatcher that comes back (same id) may then
    register a new address.
    """

    def __init__(self, dispatchers: int, workers_per_dispatcher: int, key: bytes,
                 nics: Optional[Sequence[str]] = None, fault_tolerant: bool = False) -> None:
        if dispatchers <= 0:
            raise ValueError("The number of dispatchers must be larger than 0: %d" % dispatchers)
        if workers_per_dispatcher <= 0:
            raise ValueError("The number of workers per dispatcher must be larger than 0: %d"
                             % workers_per_dispatcher)
        self._dispatchers = dispatchers
        self._workers_per_dispatcher = workers_per_dispatcher
        self._fault_tolerant = fault_tolerant
        self._addresses: List[Optional[str]] = [None] * dispatchers
        self._workers: List[Set[int]] = [set() for _ in range(dispatchers)]
        self._stopped: List[Set[int]] = [set() for _ in range(dispatchers)]
        self._released: Set[int] = set()
        self._shutdown = False
        self._cond = threading.Condition()
        self._nic, host = service_host(nics)
        self._server = _Server((host, 0), _Handler, key.hex(), NAME)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="tfhvd-compute-service", daemon=True)
        self._thread.start()
        self._closed = False

    def addresses(self) -> Dict[str, List[Tuple[str, int]]]:
        """``{interface: [(address, port)]}`` where clients reach the service."""
        host, port = self._server.server_address[:2]
        return {self._nic: [(str(host), int(port))]}

    # ---- requests ------------------------------------------------------

    def _check_id(self, dispatcher_id: int) -> int:
        dispatcher_id = int(dispatcher_id)
        if not 0 <= dispatcher_id < self._dispatchers:
            raise IndexError("Dispatcher id must be within [0..%d]: %d"
                             % (self._dispatchers - 1, dispatcher_id))
        return dispatcher_id

    def _wait(self, ready: Any, req: Dict[str, Any], activity: str, hint: str) -> bool:
        """Waits (under the lock) until ``ready()``, at most ``min(timeout,
        POLL_S)``; True when ready, False when the client should ask again,
        raises TimeoutException when ``timeout`` is shorter than a poll and
        has run out (``req``: ``timeout``, the time left to wait, and
        ``total``, the client's whole timeout, for the message)."""
        timeout = float(req["timeout"])
        poll = min(timeout, POLL_S)
        end = time.monotonic() + poll
        while not ready():
            left = end - time.monotonic()
            if left <= 0:
                if poll >= timeout:
                    raise TimeoutException(
                        "Timed out waiting for %s. Try to find out what takes the %s so long "
                        "to register or increase timeout. Timeout after %g seconds."
                        % (activity, hint, float(req.get("total", timeout))))
                return False
            self._cond.wait(left)
        return True

    def _handle(self, op: str, req: Dict[str, Any]) -> Dict[str, Any]:
        with self._cond:
            if op == "register_dispatcher":
                i, address = self._check_id(req["dispatcher_id"]), str(req["address"])
                known = self._addresses[i]
                if known is not None and known != address and not self._fault_tolerant:
                    raise ValueError("Dispatcher with id %d has already been registered under "
                                     "different address %s: %s" % (i, known, address))
                self._addresses[i] = address
                self._cond.notify_all()
                return {}
            if op == "wait_dispatcher":
                i = self._check_id(req["dispatcher_id"])
                done = self._wait(lambda: self._addresses[i] is not None, req,
                                  "dispatcher %d to register" % i, "dispatcher")
                return {"done": done, "address": self._addresses[i]}
            if op == "register_worker":
                i = self._check_id(req["dispatcher_id"])
                self._workers[i].add(int(req["worker_id"]))
                self._cond.notify_all()
                return {}
            if op == "wait_workers":
                self._check_id(req["dispatcher_id"])
                # One dispatcher serves every training rank, whatever id it asks for.
                i = int(req["dispatcher_id"]) if self._dispatchers > 1 else 0
                done = self._wait(
                    lambda: len(self._workers[i]) >= self._workers_per_dispatcher,
                    req, "workers for dispatcher %d to register" % i, "workers")
                return {"done": done}
            if op == "release":
                self._released.add(self._check_id(req["dispatcher_id"]))
                self._cond.notify_all()
                return {}
            if op == "worker_stopped":
                i = self._check_id(req["dispatcher_id"])
                self._stopped[i].add(int(req["worker_id"]))
                self._cond.notify_all()
                return {}
            if op == "wait_stopped":
                i = self._check_id(req["dispatcher_id"])
                done = self._wait(
                    lambda: len(self._stopped[i]) >= self._workers_per_dispatcher,
                    req, "workers of dispatcher %d to stop" % i, "workers")
                return {"done": done}
            if op == "shutdown":
                self._shutdown = True
                self._cond.notify_all()
                return {}
            if op == "wait_shutdown":
                # A worker's wait also ends when its dispatcher is released.
                mine = req.get("dispatcher_id")
                over = lambda: self._shutdown or mine in self._released  # noqa: E731
                end = time.monotonic() + POLL_S
                while not over() and time.monotonic() < end:
                    self._cond.wait(end - time.monotonic())
                return {"done": over()}
            if op == "state":
                return {"shutdown": self._shutdown}
        raise ValueError("unknown request %r" % op)

    def shutdown(self) -> None:
        """Releases every waiting :meth:`ComputeClient.wait_for_shutdown`, then
        stops serving (idempotent)."""
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
        if self._closed:
            return
        self._closed = True
        # Let the long polls that are waiting now answer before the socket goes.
        time.sleep(0.2)
        self._server.shutdown()
        self._server.close()
        self._thread.join(5)


class ComputeClient:
    """Talks to a :class:`ComputeService` at ``compute_addresses`` (as
    :meth:`ComputeService.addresses` gives them) with ``key``."""

    def __init__(self, compute_addresses: Addresses, key: bytes, verbose: int = 1) -> None:
        addrs = [tuple(a) for nic_addrs in compute_addresses.values() for a in nic_addrs]
        if not addrs:
            raise ValueError("no address of the compute service given")
        self._addresses = addrs
        self._secret = key.hex()
        self._verbose = verbose

    def _send(self, op: str, payload: Dict[str, Any], timeout: float = POLL_S + 30) -> Dict:
        body = json.dumps(payload).encode()
        path = "/" + op
        last: Optional[Exception] = None
        for host, port in self._addresses:
            req = urllib.request.Request("http://%s:%d%s" % (host, port, path), data=body,
                                         method="POST",
                                         headers=sign_request(self._secret, "POST", path, body))
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    answer = json.loads(resp.read().decode())
            except urllib.error.HTTPError as e:
                raise PermissionError("%s at %s:%d refused the request (HTTP %d): is the key the "
                                      "one of its config?" % (NAME, host, port, e.code)) from None
            except (urllib.error.URLError, OSError) as e:
                last = e
                continue
            if "error" in answer:
                raise _ERRORS.get(answer["error"], RuntimeError)(answer["message"])
            return answer
        raise ConnectionError("%s at %s is not reachable: %s" % (NAME, self._addresses, last))

    def _wait(self, op: str, payload: Dict[str, Any], timeout: float) -> Dict:
        end = time.monotonic() + float(timeout)
        while True:
            left = max(end - time.monotonic(), 0.001)
            answer = self._send(op, dict(payload, timeout=left, total=timeout))
            if answer.get("done"):
                return answer

    def register_dispatcher(self, dispatcher_id: int, dispatcher_address: str) -> None:
        """Tells the service where dispatcher ``dispatcher_id`` listens."""
        self._send("register_dispatcher", {"dispatcher_id": dispatcher_id,
                                           "address": dispatcher_address})

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        """The address of dispatcher ``dispatcher_id`` once it is registered;
        TimeoutException after ``timeout`` seconds."""
        answer = self._wait("wait_dispatcher", {"dispatcher_id": dispatcher_id}, timeout)
        return answer["address"]

    def register_worker_for_dispatcher(self, dispatcher_id: int, worker_id: int) -> None:
        """Records that worker ``worker_id`` of dispatcher ``dispatcher_id`` runs."""
        self._send("register_worker", {"dispatcher_id": dispatcher_id, "worker_id": worker_id})

    def wait_for_dispatcher_worker_registration(self, dispatcher_id: int, timeout: float) -> None:
        """Returns once all workers of the dispatcher registered;
        TimeoutException after ``timeout`` seconds."""
        self._wait("wait_workers", {"dispatcher_id": dispatcher_id}, timeout)

    def shutdown(self) -> None:
        """Asks the compute ranks to stop their servers and end (nothing to
        do when the service is gone: the compute job has ended already)."""
        try:
            self._send("shutdown", {})
        except ConnectionError:
            pass

    def wait_for_shutdown(self, dispatcher_id: Optional[int] = None) -> None:
        """Blocks until shutdown is asked for (or ``dispatcher_id`` is
        released, see :meth:`release_dispatcher`), or the service is gone."""
        while True:
            try:
                if self._send("wait_shutdown", {"dispatcher_id": dispatcher_id}).get("done"):
                    return
            except ConnectionError:
                return

    def release_dispatcher(self, dispatcher_id: int) -> None:
        """Tells the workers of a dispatcher that is about to stop to stop
        first (a tf.data worker whose dispatcher has gone cannot stop until
        its retries time out)."""
        self._send("release", {"dispatcher_id": dispatcher_id})

    def register_worker_stopped(self, dispatcher_id: int, worker_id: int) -> None:
        """Records that worker ``worker_id`` of the dispatcher has stopped."""
        self._send("worker_stopped", {"dispatcher_id": dispatcher_id, "worker_id": worker_id})

    def wait_for_workers_stopped(self, dispatcher_id: int, timeout: float) -> bool:
        """Waits until every worker of the dispatcher has stopped; False after
        ``timeout`` seconds or when the service is gone."""
        try:
            self._wait("wait_stopped", {"dispatcher_id": dispatcher_id}, timeout)
            return True
        except (TimeoutException, ConnectionError):
            return False

    def is_running(self) -> bool:
        """False once shutdown was asked for or the service is gone."""
        try:
            return not self._send("state", {}, timeout=10).get("shutdown")
        except ConnectionError:
            return False
