"""What every launcher shares: the bootstrap a rank gets, and the launchers' errors.

``tfhvdrun`` under mpirun (:mod:`tfhvd.runner.launch`), ``tfhvdrun --gloo``
(:mod:`tfhvd.runner.gloo`), the elastic launcher (:mod:`tfhvd.runner.elastic`)
and the engine launchers (``tfhvd.ray``, ``tfhvd.spark``) all import this
module; it imports none of them, so none imports another's entry point.

* **Slot planning.** :class:`Slot` is where one rank runs and its place in the
  job's topology; :func:`plan_slots` fills hosts' slots in order, as
  ``mpirun --map-by slot`` does.
* **Worker environment.** :func:`worker_env` is a rank's complete bootstrap
  without mpirun: Horovod's launch variables (``HOROVOD_RANK``, ``_SIZE``,
  local and cross ranks, the Gloo rendezvous address, port, interface and
  scope).  A process that has them in its environment before ``hvd.init()``
  joins the job over Gloo.  :func:`forwarded_env` names the launcher's
  variables that every rank receives (what ``mpirun -x`` passes).
* **Reaching the launcher.** :func:`launcher_address` is the address ranks
  reach a server on the launcher's host at (the rendezvous server, the
  elastic driver); :func:`iface_of` names the interface holding an address.
* **Processes.** :func:`set_pdeathsig` (a ``preexec_fn``) ends a child when
  its launcher dies.
* **Functions as jobs.** :func:`attach_payload` puts a pickled call into a
  rank's environment for :mod:`tfhvd.runner.task` (``tfhvd.run``).
* **Worker names and topology.** :func:`worker_id` names a slot ``host:index``;
  :func:`topology` gives each named worker, in rank order, its rank, local and
  cross rank and sizes (the elastic driver's worlds, the engines' slots).
* **Errors.** :class:`LaunchError` (the job cannot start; carries the exit
  code), :class:`RunError` (a ``tfhvd.run`` job failed) and
  :class:`WorkerError` (a rank of a Ray or Spark job failed).

Everything here but :func:`attach_payload` (which may write a file) is a pure
function of its arguments or reads only this host's interfaces.
"""

import os
import re
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tfhvd.runner import task
from tfhvd.runner.hosts import HostSlots

# ---- errors ---------------------------------------------------------------

EXIT_USAGE = 2          # bad command line / host list / missing program
EXIT_UNREACHABLE = 3    # a host did not answer over ssh in time
EXIT_NO_MPIRUN = 127    # as a shell says for a missing command


class LaunchError(Exception):
    """Something that stops the job before it starts; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class RunError(RuntimeError):
    """The job of :func:`tfhvd.run` failed.

    Attributes: ``rank`` (the rank that failed first, or None), ``exit_code``
    (the job's) and ``remote_traceback`` (the failing rank's traceback text,
    when it raised).
    """

    def __init__(self, message: str, rank: Optional[int] = None, exit_code: int = 1,
                 remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.remote_traceback = remote_traceback


# ---- slot planning --------------------------------------------------------

@dataclass(frozen=True)
class Slot:
    """Where one rank runs and its place in the job's topology."""

    rank: int
    hostname: str
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def plan_slots(hosts: Sequence[HostSlots], num_proc: int) -> List[Slot]:
    """Ranks in host order, filling each host's slots (mpirun's
    ``--map-by slot``): rank r's local and cross ranks follow.  Raises
    ValueError when ``num_proc`` ranks do not fit."""
    placed: List[str] = []
    for h in hosts:
        take = min(h.slots, num_proc - len(placed))
        placed += [h.hostname] * take
    if len(placed) < num_proc:
        raise ValueError("-np %d does not fit the %d slots given" % (num_proc, len(placed)))
    per_host: Dict[str, int] = {}
    local: List[int] = []
    for name in placed:
        local.append(per_host.get(name, 0))
        per_host[name] = local[-1] + 1
    out = []
    for r, name in enumerate(placed):
        same = [i for i in range(num_proc) if local[i] == local[r]]
        out.append(Slot(r, name, local[r], per_host[name], same.index(r), len(same)))
    return out


# ---- worker environment ---------------------------------------------------

# The launcher's variables that a remote rank's ssh command line may carry
# (``tfhvdrun --gloo``): the paths and the settings, by name or prefix.  The
# others (a user's API keys among them) reach it through ssh's stdin
# (tfhvd.runner.gloo.workers), never a command line that ``ps`` shows.
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
FORWARD_PREFIXES = ("TFHVD_", "HOROVOD_", "NCCL_", "TF_")
# Never forwarded: what belongs to the launcher's host, shell or MPI job.
# Horovod's list (env_util.IGNORE_REGEXES: BASH_FUNC_*, OLDPWD,
# *CUDA_VISIBLE_DEVICES), the shell's own (PWD, SHLVL, _), the host's
# (HOSTNAME, SSH_*: the launcher's ssh session and agent socket) and an
# enclosing MPI job's (OMPI_*, PMIX_*, PMI_*: mpirun passes OMPI_MCA_*
# settings on by itself).
_NOT_FORWARDED = re.compile(r"^(BASH_FUNC_.*|OLDPWD|PWD|SHLVL|_|HOSTNAME|SSH_.*|"
                            r".*CUDA_VISIBLE_DEVICES|OMPI_.*|PMIX_.*|PMI_.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Per-job variables the launcher sets itself, never forwarded from its own
# environment (a launcher started inside another job must not leak them).
WORKER_KEYS = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
               "HOSTNAME", "GLOO_RENDEZVOUS_ADDR", "GLOO_RENDEZVOUS_PORT", "GLOO_IFACE",
               "GLOO_SCOPE", "CONTROLLER", "CPU_OPERATIONS")


def forwarded_env(env: Mapping[str, str]) -> List[str]:
    """Names of the launcher's variables that every rank receives, on every
    host (sorted): all of them, as horovodrun passes them (``-x NAME`` each
    under mpirun), but those of the launcher's host, shell or MPI job
    (``_NOT_FORWARDED``)."""
    return sorted(k for k in env if _ENV_NAME.match(k) and not _NOT_FORWARDED.match(k))


def on_command_line(name: str) -> bool:
    """Whether a forwarded variable may be written on a remote rank's ssh
    command line (PATH, LD_LIBRARY_PATH, PYTHONPATH, TFHVD_*, HOROVOD_*,
    NCCL_*, TF_*); the others travel through ssh's stdin."""
    return name in FORWARD_NAMES or name.startswith(FORWARD_PREFIXES)


def worker_env(base: Mapping[str, str], slot: Slot, size: int, addr: str, port: int,
               iface: Optional[str], extra: Optional[Mapping[str, str]] = None,
               scope: Optional[str] = None) -> Dict[str, str]:
    """A rank's environment for a Gloo job whose rendezvous server listens at
    ``addr:port``.

    ``base`` without other jobs' per-rank variables, then Horovod's launch
    variables (their TFHVD_* twins are not set, so a user's TFHVD_RANK cannot
    shadow them), then ``extra``.  ``iface`` sets HOROVOD_GLOO_IFACE (the
    interface Gloo's connections use; None: Gloo chooses).  ``scope`` sets
    HOROVOD_GLOO_SCOPE, the rendezvous scope of the rank's next ``init()``
    (a driver that rebuilds worlds gives each its own)."""
    drop = {p + k for p in ("TFHVD_", "HOROVOD_") for k in WORKER_KEYS}
    env = {k: v for k, v in base.items() if k not in drop}
    env.update({
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    })
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    if scope:
        env["HOROVOD_GLOO_SCOPE"] = scope
    env.update(extra or {})
    return env


# ---- reaching the launcher ------------------------------------------------

def launcher_address(remote: Sequence[str], iface: Optional[str]) -> str:
    """The address workers reach a server on this host at: 127.0.0.1 for a
    job on this host only; the address of ``iface`` if given; else the
    address this host uses to route to the first remote host."""
    if not remote:
        return "127.0.0.1"
    if iface:
        addr = iface_address(iface)
        if addr:
            return addr
    try:
        target = socket.getaddrinfo(remote[0].strip("[]"), 1, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


BIND_ENV = "TFHVD_BIND_ADDR"


def bind_address(addr: str, env: Mapping[str, str]) -> str:
    """Where a launcher's server listens: the address the ranks are given
    (loopback for a one-host job, the interface that reaches the hosts for
    a multi-host one), or ``TFHVD_BIND_ADDR`` when the user asks (e.g.
    ``0.0.0.0`` for hosts that reach this one through a NAT)."""
    return env.get(BIND_ENV) or addr


def iface_address(iface: str) -> Optional[str]:
    """The IPv4 address of this host's interface ``iface``, or None."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915,  # SIOCGIFADDR
                                 struct.pack("256s", iface[:15].encode()))
            return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def iface_of(addr: str) -> Optional[str]:
    """The name of this host's interface that has ``addr``, or None."""
    for _, name in socket.if_nameindex():
        if iface_address(name) == addr:
            return name
    return None


# ---- processes ------------------------------------------------------------

def set_pdeathsig(signum: int = signal.SIGTERM) -> None:
    """In the child (a ``preexec_fn``): get ``signum`` (SIGTERM) if the
    launcher dies, so no rank or mpirun outlives it (Linux only; elsewhere a
    no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signum))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# ---- functions as jobs (tfhvd.run) ----------------------------------------

# Above this the function travels in a file (which remote hosts must share).
_ENV_PAYLOAD_LIMIT = 64 * 1024


def attach_payload(fn: Callable[..., Any], args: Sequence[Any],
                   kwargs: Optional[Mapping[str, Any]], env: Dict[str, str]) -> Optional[str]:
    """Puts the pickled call into ``env`` (or a file it names, returned so the
    caller removes it) for :mod:`tfhvd.runner.task`.  Raises TypeError when
    the call cannot be pickled."""
    try:
        call = task.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise TypeError("tfhvd.run() cannot pickle %r with its arguments: %s (install "
                        "cloudpickle to send lambdas and closures)" % (fn, e)) from e
    sys_path = [os.path.abspath(p or os.curdir) for p in sys.path]
    payload = task.encode({"call": call, "sys_path": sys_path})
    if len(payload) <= _ENV_PAYLOAD_LIMIT:
        env[task.PAYLOAD_ENV] = payload
        return None
    fd, payload_file = tempfile.mkstemp(prefix="tfhvd-run-", suffix=".payload")
    with os.fdopen(fd, "w") as f:
        f.write(payload)
    env[task.PAYLOAD_FILE_ENV] = payload_file
    env.pop(task.PAYLOAD_ENV, None)
    return payload_file


# Workers of elastic and engine jobs are named host:index; their topology
# follows from the names in rank order.
def worker_id(host: str, index: int) -> str:
    """The name of slot ``index`` of ``host``."""
    return "%s:%d" % (host, index)


def split_id(wid: str) -> Tuple[str, int]:
    """``(host, index)`` of a worker name."""
    host, _, index = wid.rpartition(":")
    return host, int(index)


def topology(members: Sequence[str]) -> Dict[str, Dict[str, int]]:
    """rank, size, local_rank, local_size, cross_rank, cross_size of each member."""
    by_host: Dict[str, List[str]] = {}
    for w in members:
        by_host.setdefault(split_id(w)[0], []).append(w)
    out: Dict[str, Dict[str, int]] = {}
    for rank, w in enumerate(members):
        host = split_id(w)[0]
        local_rank = by_host[host].index(w)
        cross_hosts = [h for h, ws in by_host.items() if len(ws) > local_rank]
        out[w] = {"rank": rank, "size": len(members), "local_rank": local_rank,
                  "local_size": len(by_host[host]), "cross_rank": cross_hosts.index(host),
                  "cross_size": len(cross_hosts)}
    return out


class WorkerError(RuntimeError):
    """A rank of an engine job failed: it raised, or its worker died.

    ``rank`` is the rank, ``worker_traceback`` the rank's traceback text (empty
    when the worker process died without one).
    """

    def __init__(self, message: str, rank: int, worker_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.worker_traceback = worker_traceback

    def __reduce__(self):  # picklable across engine processes
        return (WorkerError, (self.args[0], self.rank, self.worker_traceback))
