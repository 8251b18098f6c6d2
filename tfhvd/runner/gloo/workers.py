"""The workers of a Gloo job: where each rank runs, its environment, and
its process (local, or over ssh through :mod:`tfhvd.runner.gloo.guard`).

Slot planning and the rank's environment (:class:`Slot`, :func:`plan_slots`,
:func:`worker_env`) live in :mod:`tfhvd.runner.common`, which every launcher
shares; they are importable from here too.  Everything here but
:class:`Worker` is a pure function, so tests (and an elastic driver) can see
exactly what would run without starting anything.
"""

import json
import os
import shlex
import subprocess
import sys
from typing import List, Mapping, Optional, Sequence

from tfhvd.runner.common import (  # noqa: F401  (Slot, plan_slots, worker_env re-exported)
    Slot, forwarded_env, on_command_line, plan_slots, set_pdeathsig, worker_env)
from tfhvd.common.secret import HOROVOD_SECRET_ENV, SECRET_ENV


def remote_command(ssh: Sequence[str], host: str, command: Sequence[str],
                   env: Mapping[str, str], cwd: str, python: str = sys.executable) -> List[str]:
    """The ssh command line that runs ``command`` as one rank on ``host``:
    in ``cwd``, under the guard (which ends the rank when the ssh connection
    goes away), with the forwarded part of ``env`` (every variable, as
    horovodrun passes them: :func:`forwarded_env`).  Only PATH,
    LD_LIBRARY_PATH, PYTHONPATH, TFHVD_*, HOROVOD_*, NCCL_* and TF_* are
    written on it, the job's secret excepted: a command line is visible to
    every user of both hosts (``ps``), so the secret and the user's other
    variables (API keys, say) come as the first line of the ssh's stdin
    (:func:`remote_env_line`, ``Worker``'s ``stdin_line``), which the guard
    reads into the rank's environment before it starts the rank."""
    hidden = (SECRET_ENV, HOROVOD_SECRET_ENV)
    assigns = " ".join("%s=%s" % (k, shlex.quote(env[k])) for k in forwarded_env(env)
                       if on_command_line(k) and k not in hidden)
    inner = "cd %s && exec env %s %s -m tfhvd.runner.gloo.guard --env-line -- %s" % (
        shlex.quote(cwd), assigns, shlex.quote(python),
        " ".join(shlex.quote(c) for c in command))
    return list(ssh) + ["-o", "BatchMode=yes", host.strip("[]"), inner]


def remote_env_line(env: Mapping[str, str], secret: Optional[str]) -> str:
    """The first line a remote rank's guard reads from stdin: JSON of the
    forwarded variables :func:`remote_command` leaves off the command line,
    and the job's secret under both its names."""
    extra = {k: env[k] for k in forwarded_env(env) if not on_command_line(k)}
    if secret is not None:
        extra.update({SECRET_ENV: secret, HOROVOD_SECRET_ENV: secret})
    return json.dumps(extra, sort_keys=True)


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
