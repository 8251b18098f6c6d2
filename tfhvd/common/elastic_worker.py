"""The worker's side of the elastic driver: host-update notifications and the
request for the next world after a reset.

A worker started by the elastic driver finds it through ``TFHVD_ELASTIC_DRIVER``
(``addr:port``) and knows itself by ``TFHVD_ELASTIC_WORKER`` (``host:slot``,
fixed for the life of the process, unlike its rank).  Two conversations, both
plain HTTP with JSON bodies against the driver's service
(:mod:`tfhvd.runner.elastic.service`):

* **notifications**: a daemon thread long-polls ``GET /elastic/notify`` with
  the world (round) it belongs to.  The request blocks in the driver until the
  hosts change or 30 s pass, so an idle worker costs one sleeping thread and
  one request every 30 s, never a busy loop.  Each update is handed to the
  registered listeners (the ``State`` objects), which act on it at their next
  ``commit()``.
* **the next world**: after ``shutdown()`` the worker posts
  ``/elastic/ready``; the answer comes when the driver has formed the next
  round (every worker of the old one is ready, finished or gone), and says
  this worker's new rank and size, or that it must leave.

Nothing here imports TensorFlow.
"""

import json
import logging
import os
import threading
import urllib.error
from enum import IntFlag
from typing import Any, Dict, Optional, Set

from tfhvd.common.secret import secret_from_env, signed_urlopen

DRIVER_ENV = "TFHVD_ELASTIC_DRIVER"
WORKER_ENV = "TFHVD_ELASTIC_WORKER"
ROUND_ENV = "TFHVD_ELASTIC_ROUND"
ELASTIC_ENV = "HOROVOD_ELASTIC"
# Topology variables a worker's runtime reads at init; rewritten at each reset.
TOPOLOGY_ENV = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")

NOTIFY_WAIT_S = 30.0
_RETRY_S = 5.0  # after a failed long poll, the listener waits this long before the next
log = logging.getLogger("tfhvd.elastic")
# Set whenever this process joins a new world (apply_world), for the
# notification thread waiting to ask about it.
_world_changed = threading.Event()


class HostUpdateResult(IntFlag):
    """What a host update did (Horovod's flags): hosts or slots removed, added."""

    no_update = 0
    removed = 1
    added = 2
    mixed = 3


class ElasticJobError(RuntimeError):
    """The driver ended the job (timeout, reset limit, every worker failed)."""


class WorkerLeave(Exception):
    """This worker has no place in the next world (its host was removed); it
    should exit with status 0.  Raised by :func:`next_world`."""


def in_elastic_job() -> bool:
    """Whether this process was started by the elastic driver."""
    return bool(os.environ.get(DRIVER_ENV))


def _url(path: str, driver: Optional[str] = None) -> str:
    return "http://%s%s" % (driver or os.environ[DRIVER_ENV], path)


def _post(path: str, body: Dict[str, Any], timeout: Optional[float],
          driver: Optional[str] = None, secret: Optional[str] = None) -> Dict[str, Any]:
    """POSTs ``body`` to the driver at ``driver`` (default: this process's
    ``TFHVD_ELASTIC_DRIVER``), signed with ``secret`` (default: the job's
    secret in this process's environment; the driver answers no one else)."""
    data = json.dumps(body).encode()
    key = secret if secret is not None else (secret_from_env() or "")
    with signed_urlopen(key, _url("", driver), "POST", path, data,
                        {"Content-Type": "application/json"}, timeout) as resp:
        return json.loads(resp.read().decode() or "{}")


def worker_id() -> str:
    """``host:slot`` of this worker (the driver's name for it)."""
    return os.environ.get(WORKER_ENV, "")


def current_round() -> int:
    """The world (round) this worker belongs to now."""
    return int(os.environ.get(ROUND_ENV, "0") or 0)


def apply_world(world: Dict[str, Any]) -> None:
    """Writes a world's topology into this process's environment, where the
    runtime reads it at ``init()`` (both ``HOROVOD_*`` and ``TFHVD_*`` names)."""
    for key in TOPOLOGY_ENV:
        value = str(int(world[key]))
        os.environ["HOROVOD_" + key.upper()] = value
        os.environ["TFHVD_" + key.upper()] = value
    for name, value in (world.get("env") or {}).items():
        os.environ[str(name)] = str(value)
    os.environ[ROUND_ENV] = str(int(world["round"]))
    _world_changed.set()


def next_world(reason: str, timeout: Optional[float] = None) -> Dict[str, Any]:
    """Tells the driver this worker is ready for a new world and waits for it.

    Returns the new world (``round``, ``rank``, ``size``, ..., ``fresh``: whether
    it has workers that hold no state yet) after writing it to the environment.
    Raises :class:`WorkerLeave` when this worker is not part of it and
    :class:`ElasticJobError` when the driver ended the job.
    """
    body = {"worker": worker_id(), "round": current_round(), "reason": reason}
    try:
        answer = _post("/elastic/ready", body, timeout)
    except (urllib.error.URLError, OSError) as e:
        raise ElasticJobError("tfhvd elastic: lost the driver at %s (%s); the job has ended"
                              % (os.environ.get(DRIVER_ENV), e)) from None
    action = answer.get("action")
    if action == "leave":
        raise WorkerLeave(answer.get("message", "this worker is not part of the new world"))
    if action != "run":
        raise ElasticJobError(answer.get("message") or "tfhvd elastic: the driver ended the job")
    apply_world(answer)
    return answer


class WorkerNotificationManager:
    """Delivers the driver's host updates to listeners (``State`` objects).

    ``init()`` starts the long-polling thread, and only in a job started by
    the elastic driver; elsewhere it does nothing and no update ever comes.
    The thread reads the driver's address, the job's secret and this
    worker's id once, when it starts, so a process that later changes its
    environment (an engine that gives a reused worker its own environment
    back) does not pull them from under it.  ``shutdown()`` stops it (at the
    end of a job run in a process that outlives the job); a later ``init()``
    starts a fresh one, for the driver its environment names then.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: Set[Any] = set()
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def init(self) -> None:
        """Starts listening to the driver: idempotent while the listener runs,
        a fresh listener after :meth:`shutdown` (or if the last one ended), a
        no-op outside elastic jobs."""
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if (alive and not self._stop.is_set()) or not in_elastic_job():
                return
            # Each listener has its own stop flag: one still finishing a long
            # poll of the previous job ends by itself, without delivering.
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._poll, name="tfhvd-elastic-notify", daemon=True,
                args=(os.environ[DRIVER_ENV], secret_from_env() or "", worker_id(), self._stop))
            self._thread.start()

    def shutdown(self, timeout: float = 0.0) -> None:
        """Stops the listener (no update is delivered after this returns).

        A long poll in flight is not interrupted: the thread (a daemon) ends
        when that request returns, at most :data:`NOTIFY_WAIT_S` seconds
        later or as soon as the driver goes; ``timeout`` > 0 waits that long
        for it."""
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None and timeout > 0 and thread is not threading.current_thread():
            thread.join(timeout)

    def is_listening(self) -> bool:
        """Whether a listener thread runs for the current job."""
        with self._lock:
            return (self._thread is not None and self._thread.is_alive()
                    and not self._stop.is_set())

    def register_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp: int, update: HostUpdateResult,
                             stop: Optional[threading.Event] = None) -> None:
        """Passes one update to every listener (also what tests call directly);
        none when ``stop`` (the polling listener's flag) is set: the update is
        from a job :meth:`shutdown` ended."""
        with self._lock:
            if stop is not None and stop.is_set():
                return
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update)

    def _poll(self, driver: str, secret: str, worker: str, stop: threading.Event) -> None:
        """The listener: long polls, one at a time, until ``stop`` is set.  A
        failed request is tried again after :data:`_RETRY_S` seconds (the
        driver is restarting or the job is ending); an unexpected error is
        logged once, then treated the same, so the thread never dies of it."""
        last_seq = 0
        logged = False
        while not stop.is_set():
            try:
                body = {"worker": worker, "round": current_round(), "since": last_seq,
                        "wait": NOTIFY_WAIT_S}
                answer = _post("/elastic/notify", body, NOTIFY_WAIT_S + 30, driver, secret)
                if stop.is_set():
                    return  # an answer for a job this process has left
                newer = int(answer.get("round", 0))
                if newer > current_round():
                    # Our world ended; wait (sleeping) until this process joins the next.
                    _world_changed.clear()
                    if newer > current_round():
                        _world_changed.wait(_RETRY_S)
                    continue
                seq = int(answer.get("seq", 0))
                if seq > last_seq:
                    last_seq = seq
                    self.handle_hosts_updated(seq, HostUpdateResult(int(answer.get("update", 0))),
                                              stop)
            except (urllib.error.URLError, OSError):
                pass  # the driver is gone or restarting: try again slowly, never spin
            except Exception:  # noqa: BLE001 - a dead listener would lose every update
                if not logged:
                    logged = True
                    log.warning("tfhvd elastic: the host-update listener of worker %s (driver "
                                "%s) failed; it keeps listening", worker, driver, exc_info=True)
            else:
                continue
            if stop.wait(_RETRY_S):
                return
