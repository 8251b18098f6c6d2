"""The workers of a Gloo job: where each rank runs, its environment, and
its process (local, or over ssh through :mod:`tfhvd.runner.gloo.guard`).

Slot planning and the rank's environment (:class:`Slot`, :func:`plan_slots`,
:func:`worker_env`) live in :mod:`tfhvd.runner.common`, which every launcher
shares; they are importable from here too.  Everything here but
:class:`Worker` is a pure function, so tests (and an elastic driver) can see
exactly what would run without starting anything.
"""

import os
import shlex
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from tfhvd.runner.common import (  # noqa: F401  (Slot, plan_slots, worker_env re-exported)
    Slot, forwarded_env, plan_slots, set_pdeathsig, worker_env)
from tfhvd.common.secret import HOROVOD_SECRET_ENV, SECRET_ENV


def remote_command(ssh: Sequence[str], host: str, command: Sequence[str],
                   env: Mapping[str, str], cwd: str, python: str = sys.executable) -> List[str]:
    """The ssh command line that runs ``command`` as one rank on ``host``:
    in ``cwd``, with the forwarded part of ``env``, under the guard (which
    ends the rank when the ssh connection goes away).  The forwarded
    variables are those mpirun -x would pass (PATH, LD_LIBRARY_PATH,
    PYTHONPATH, TFHVD_*, HOROVOD_*, NCCL_*, TF_*), except the job's secret:
    a command line is visible to every user of both hosts (``ps``), so the
    secret comes as the first line of the ssh's stdin (``Worker``'s
    ``stdin_line``), read into the environment before the rank starts."""
    hidden = (SECRET_ENV, HOROVOD_SECRET_ENV)
    assigns = " ".join("%s=%s" % (k, shlex.quote(env[k])) for k in forwarded_env(env)
                       if k not in hidden)
    read = ""
    if any(k in env for k in hidden):
        read = "IFS= read -r %s && export %s %s=\"$%s\" && " % (
            SECRET_ENV, SECRET_ENV, HOROVOD_SECRET_ENV, SECRET_ENV)
    inner = "cd %s && %sexec env %s %s -m tfhvd.runner.gloo.guard -- %s" % (
        shlex.quote(cwd), read, assigns, shlex.quote(python),
        " ".join(shlex.quote(c) for c in command))
    return list(ssh) + ["-o", "BatchMode=yes", host.strip("[]"), inner]


class Worker:
    """One rank's process: local, or the ssh client of a remote one."""

    def __init__(self, slot: Slot, argv: Sequence[str], env: Mapping[str, str],
                 remote: bool, stdin_line: Optional[str] = None) -> None:
        self.slot = slot
        self.remote = remote
        self.argv = list(argv)
        self.proc = subprocess.Popen(self.argv, env=dict(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE,
                                     stdin=subprocess.PIPE if remote else subprocess.DEVNULL,
                                     preexec_fn=set_pdeathsig, start_new_session=True)
        if remote and stdin_line is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write(stdin_line.encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:
                pass  # ssh failed at once: its exit code says why

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
