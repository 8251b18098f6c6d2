"""What the cluster-engine launchers (:mod:`tfhvd.ray`, :mod:`tfhvd.spark`)
share: the same bootstrap ``tfhvdrun --gloo`` gives a rank, built from the
engine's own placement of the workers.

An engine launcher

1. starts a :class:`~tfhvd.runner.gloo.rendezvous.RendezvousServer` on the
   driver (:func:`driver_endpoint` says where, from the workers' hosts);
2. learns the host of every worker, in rank order, and turns that into slots
   with :func:`engine_slots` (the elastic driver's ``topology``: local rank
   by host, cross rank by local rank);
3. hands each worker its :class:`Bootstrap`; the worker calls
   :meth:`Bootstrap.apply` before ``hvd.init()``, which sets Horovod's launch
   variables in its own environment through the Gloo launcher's
   ``worker_env``, exactly as ``tfhvdrun --gloo`` would have.

A function a rank runs goes through :func:`call_as_rank`, so that an
exception reaches the driver as a :class:`WorkerError` naming the rank and
carrying its traceback.

A rank also moves into a session of its own (:func:`own_session`), as every
rank ``tfhvdrun`` starts has one.  On Linux with the autogroup scheduler
(``/proc/sys/kernel/sched_autogroup_enabled``, on in most distributions) a
session is a scheduling group; ranks left in the engine's session (Ray's and
Spark's workers share their driver's) ran 4-15% slower than ``tfhvdrun``'s,
see ``docs/PERFORMANCE.md``.
"""

import contextlib
import importlib
import os
import signal
import socket
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from tfhvd.runner.common import BIND_ENV, Slot, WorkerError, iface_of, set_pdeathsig, topology, \
    worker_env, worker_id

LOOPBACK = "127.0.0.1"


def require_engine(module: str, extra: str, what: str, requirement: str) -> Any:
    """Imports the engine ``module``, or raises an ImportError that says how
    to install it: the engine's own package (``requirement``, the range of
    tfhvd's ``extra``), or the extra from a tfhvd checkout or sdist (tfhvd is
    not on the package index, so ``pip install tfhvd[extra]`` would fail)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            "%s needs %s, which is not installed: pip install \"%s\" (or, from a tfhvd "
            "checkout or sdist: pip install --no-build-isolation \"/path/to/tfhvd[%s]\") (%s)"
            % (what, module, requirement, extra, e)) from e


def call_as_rank(rank: int, fn: Callable, args: Sequence = (),
                 kwargs: Optional[Mapping] = None) -> Any:
    """``fn(*args, **kwargs)``; an exception becomes a :class:`WorkerError`
    naming ``rank`` and carrying the traceback (the original is its cause)."""
    try:
        return fn(*args, **(kwargs or {}))
    except BaseException as e:  # noqa: BLE001 - reported to the driver, by rank
        tb = traceback.format_exc()
        raise WorkerError("rank %d raised %s: %s\n%s" % (rank, type(e).__name__, e, tb),
                          rank, tb) from e


def engine_slots(hosts: Sequence[str]) -> List[Slot]:
    """The slots of a job whose rank r runs on ``hosts[r]``: local ranks
    count the ranks of each host, cross ranks the hosts of each local rank
    (what ``tfhvdrun`` gives ranks placed host by host)."""
    seen: Dict[str, int] = {}
    members = []
    for h in hosts:
        members.append(worker_id(h, seen.get(h, 0)))
        seen[h] = seen.get(h, 0) + 1
    info = topology(members)
    return [Slot(info[m]["rank"], h, info[m]["local_rank"], info[m]["local_size"],
                 info[m]["cross_rank"], info[m]["cross_size"])
            for m, h in zip(members, hosts)]


def rank_order(hosts: Sequence[str]) -> List[int]:
    """Indices of ``hosts`` reordered so that the workers of one host get
    consecutive ranks (hosts in order of first appearance)."""
    first: Dict[str, int] = {}
    for i, h in enumerate(hosts):
        first.setdefault(h, i)
    return sorted(range(len(hosts)), key=lambda i: (first[hosts[i]], i))


def driver_endpoint(driver_host: str, worker_hosts: Sequence[str]) -> Tuple[str, str]:
    """(bind address, address workers use) of the rendezvous server: loopback
    when every worker runs on the driver's host, else the driver's address
    (``driver_host``, an address of this host), bound to that address only
    (``TFHVD_BIND_ADDR`` overrides: see :func:`engine_bind`)."""
    if all(h == driver_host for h in worker_hosts):
        return LOOPBACK, LOOPBACK
    return engine_bind(driver_host), driver_host


def engine_bind(driver_host: str) -> str:
    """Where a driver's server listens when workers reach it at
    ``driver_host``: ``TFHVD_BIND_ADDR`` if set; else that address when it is
    one of this host's, else every interface (a name such as Spark's
    ``spark.driver.host`` that resolves here to another address)."""
    if os.environ.get(BIND_ENV):
        return os.environ[BIND_ENV]
    try:
        ip = socket.gethostbyname(driver_host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((ip, 0))
        return ip if not ip.startswith("127.") else "0.0.0.0"
    except OSError:
        return "0.0.0.0"


def node_address() -> str:
    """This host's address as other hosts see it (the one that routes out)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 1))  # no packet is sent
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


@dataclass
class Bootstrap:
    """One rank's part of the job, sent from the driver to its worker."""

    slot: Slot
    size: int
    addr: str
    port: int
    scope: str
    extra_env: Dict[str, str] = field(default_factory=dict)
    iface: Optional[str] = None

    def environment(self, base: Mapping[str, str], local_addr: Optional[str] = None
                    ) -> Dict[str, str]:
        """The rank's whole environment (``base`` plus the launch variables)."""
        iface = self.iface
        if iface is None:
            iface = "lo" if self.addr == LOOPBACK else iface_of(local_addr or node_address())
        extra = {"HOROVOD_GLOO_TIMEOUT_SECONDS": base.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "60")}
        extra.update(self.extra_env)
        return worker_env(base, self.slot, self.size, self.addr, self.port, iface, extra,
                          scope=self.scope)

    def apply(self, local_addr: Optional[str] = None) -> None:
        """Makes this process that rank: sets its environment (what
        ``hvd.init()`` reads), dropping another job's per-rank variables,
        and gives it a session of its own (:func:`own_session`).  A process
        that outlives the job (a reused engine worker) should run the rank
        inside :func:`restored_after_job`."""
        become_rank(self.environment(dict(os.environ), local_addr))


def become_rank(env: Mapping[str, str]) -> None:
    """Makes ``env`` this process's whole environment (what ``hvd.init()``
    reads, without another job's per-rank variables) and moves it into a
    session of its own (:func:`own_session`)."""
    for k in [k for k in os.environ if k not in env]:
        del os.environ[k]
    os.environ.update(env)
    own_session()


@contextlib.contextmanager
def restored_after_job() -> Iterator[None]:
    """Gives back, when the ``with`` block ends (normally or not), the
    environment and working directory this process had when it began.

    An engine may run the next job in the same process (Spark reuses its
    Python workers): a rank's launch variables, the job's ``env`` and what
    ``fn`` set itself must not reach that job, which Horovod runs in a fresh
    process.  ``os.environ`` is restored in place (the mapping object stays,
    so references to it stay valid)."""
    saved = dict(os.environ)
    try:
        cwd: Optional[str] = os.getcwd()
    except OSError:  # the folder was removed under us
        cwd = None
    try:
        yield
    finally:
        for k in [k for k in os.environ if k not in saved]:
            del os.environ[k]
        for k, v in saved.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        if cwd is not None:
            try:
                os.chdir(cwd)
            except OSError:
                pass  # gone since: stay where the job left us


SESSION_VAR = "TFHVD_ENGINE_SESSION"


def session_mode(env: Mapping[str, str], where: str = "") -> str:
    """``TFHVD_ENGINE_SESSION`` in ``env``: ``own`` (the default) or
    ``inherit``; anything else is a ValueError naming it (and ``where``).
    The launchers check the variables they pass before starting anything."""
    mode = env.get(SESSION_VAR, "own").strip().lower() or "own"
    if mode not in ("own", "inherit"):
        raise ValueError("%s%s=%r: expected 'own' (the default: a session of the rank's own) "
                         "or 'inherit' (stay in the engine's)"
                         % (where + ": " if where else "", SESSION_VAR, env[SESSION_VAR]))
    return mode


def own_session() -> bool:
    """Moves this engine worker into a new session, and so into a scheduling
    group of its own where the kernel groups by session (autogroup); returns
    whether it now leads its session.  ``TFHVD_ENGINE_SESSION=inherit`` in
    the rank's environment keeps the engine's session.

    A process-group leader cannot call ``setsid`` (a Ray worker leads its
    own group): it first joins its parent's group, then ``setsid`` makes it
    the leader of a new session and of a new group with its own pid again,
    so an engine that signals the worker's group (Ray's process-group
    cleanup) still reaches it.  A worker that leaves the group its parent
    leads (PySpark's daemon ends its workers with a SIGHUP to its group)
    gets that SIGHUP when the parent dies instead, where the parent has a
    single thread (see :func:`_threads`)."""
    if session_mode(os.environ) == "inherit":
        return False
    pid = os.getpid()
    if os.getsid(0) == pid:
        return True
    old_group, parent = os.getpgid(0), os.getppid()
    try:
        if old_group == pid:
            os.setpgid(0, os.getpgid(parent))
        os.setsid()
    except OSError:
        if os.getpgid(0) != old_group:
            try:
                os.setpgid(0, 0)  # back to a group of its own
            except OSError:
                pass
        return False
    if old_group == parent and _threads(parent) == 1:
        set_pdeathsig(signal.SIGHUP)
        if os.getppid() != parent:  # it died before the signal was armed
            os.kill(os.getpid(), signal.SIGHUP)
    return True


def _threads(pid: int) -> int:
    """``pid``'s thread count (0 when unknown).  The parent-death signal
    follows the parent thread that forked the child, so it stands for the
    parent's death only when the parent has one thread (PySpark's daemon);
    a JVM parent (PySpark without its daemon) would end the worker when the
    thread that started it exits."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0
