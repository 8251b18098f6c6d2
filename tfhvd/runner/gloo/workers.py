"""The workers of a Gloo job: where each rank runs, its environment, and
its process (local, or over ssh through :mod:`tfhvd.runner.gloo.guard`).

Everything here but :class:`Worker` is a pure function, so tests (and an
elastic driver) can see exactly what would run without starting anything.
"""

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from tfhvd.runner.hosts import HostSlots
from tfhvd.runner.launch import _set_pdeathsig, forwarded_env
# Per-job variables the launcher sets itself, never forwarded from its own
# environment (a launcher started inside another job must not leak them).
_WORKER_KEYS = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE",
                "HOSTNAME", "GLOO_RENDEZVOUS_ADDR", "GLOO_RENDEZVOUS_PORT", "GLOO_IFACE",
                "GLOO_SCOPE", "CONTROLLER", "CPU_OPERATIONS")


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
    ``--map-by slot``): rank r's local and cross ranks follow."""
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


def worker_env(base: Mapping[str, str], slot: Slot, size: int, addr: str, port: int,
               iface: Optional[str], extra: Optional[Mapping[str, str]] = None,
               scope: Optional[str] = None) -> Dict[str, str]:
    """A rank's environment: ``base`` without other jobs' per-rank
    variables, then Horovod's launch variables (and their TFHVD_* twins are
    not set, so a user's TFHVD_RANK cannot shadow them), then ``extra``.
    ``scope`` sets HOROVOD_GLOO_SCOPE, the rendezvous scope of the rank's
    next ``init()`` (a driver that rebuilds worlds gives each its own)."""
    drop = {p + k for p in ("TFHVD_", "HOROVOD_") for k in _WORKER_KEYS}
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


def remote_command(ssh: Sequence[str], host: str, command: Sequence[str],
                   env: Mapping[str, str], cwd: str, python: str = sys.executable) -> List[str]:
    """The ssh command line that runs ``command`` as one rank on ``host``:
    in ``cwd``, with the forwarded part of ``env``, under the guard (which
    ends the rank when the ssh connection goes away).  The forwarded
    variables are those mpirun -x would pass (PATH, LD_LIBRARY_PATH,
    PYTHONPATH, TFHVD_*, HOROVOD_*, NCCL_*, TF_*)."""
    assigns = " ".join("%s=%s" % (k, shlex.quote(env[k])) for k in forwarded_env(env))
    inner = "cd %s && exec env %s %s -m tfhvd.runner.gloo.guard -- %s" % (
        shlex.quote(cwd), assigns, shlex.quote(python),
        " ".join(shlex.quote(c) for c in command))
    return list(ssh) + ["-o", "BatchMode=yes", host.strip("[]"), inner]


class Worker:
    """One rank's process: local, or the ssh client of a remote one."""

    def __init__(self, slot: Slot, argv: Sequence[str], env: Mapping[str, str],
                 remote: bool) -> None:
        self.slot = slot
        self.remote = remote
        self.argv = list(argv)
        self.proc = subprocess.Popen(self.argv, env=dict(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
                                     preexec_fn=_set_pdeathsig, start_new_session=True)

    @property
    def rank(self) -> int:
        return self.slot.rank

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to the rank's process group (a remote rank: to its
        ssh, whose end closes the guard's stdin, which ends the rank)."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        if self.remote and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
