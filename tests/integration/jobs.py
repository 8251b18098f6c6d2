"""Helpers for the integration tests: real jobs started with tfhvdrun.

Every job runs with a hard timeout; when it passes, the launcher is stopped
(which stops mpirun and the ranks), so a broken test fails instead of
hanging the suite.
"""

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "integration", "scripts")
TRAIN = os.path.join(SCRIPTS, "train.py")


def tfhvdrun() -> List[str]:
    """The launcher: the ``tfhvdrun`` console script when installed beside
    this Python, else ``python -m tfhvd.runner`` (the same code)."""
    script = os.path.join(os.path.dirname(sys.executable), "tfhvdrun")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "tfhvd.runner"]


def tfhvd_timeline() -> List[str]:
    script = os.path.join(os.path.dirname(sys.executable), "tfhvd-timeline")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "tfhvd.timeline"]


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """This process's environment without MPI job variables (a test may run
    under mpirun itself) and without inherited stall settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_"))
           and not k.startswith(("TFHVD_STALL", "HOROVOD_STALL", "TFHVD_TIMELINE",
                                 "HOROVOD_TIMELINE"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Job:
    rc: int
    out: str
    err: str
    seconds: float

    @property
    def output(self) -> str:
        return self.out + self.err

    def explain(self) -> str:
        tail = "\n".join(self.output.splitlines()[-60:])
        return "exit code %d after %.1f s; output tail:\n%s" % (self.rc, self.seconds, tail)


def run(argv: Sequence[str], timeout: float = 120, env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None, prefix: Sequence[str] = ()) -> Job:
    """Runs ``[*prefix, *argv]``; on timeout stops it and fails the test."""
    start = time.monotonic()
    proc = subprocess.Popen(list(prefix) + list(argv), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=clean_env() if env is None else env, cwd=cwd or ROOT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGTERM to the launcher ends mpirun and the ranks; then make sure.
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail("timed out after %g s (a hang): %s\n%s" % (
            timeout, " ".join(argv), "\n".join((out + err).splitlines()[-60:])))
    return Job(proc.returncode, out, err, time.monotonic() - start)


# Extra tfhvdrun flags for every job, e.g. TFHVD_TEST_LAUNCHER_ARGS=--gloo to
# run the same tests without mpirun (test_gloo.py does, for the fault tests).
LAUNCHER_ARGS_ENV = "TFHVD_TEST_LAUNCHER_ARGS"


def launch(args: Sequence[str], timeout: float = 120, env: Optional[Dict[str, str]] = None,
           **kw) -> Job:
    """``tfhvdrun [$TFHVD_TEST_LAUNCHER_ARGS] ARGS`` with a timeout."""
    extra = os.environ.get(LAUNCHER_ARGS_ENV, "").split()
    return run(tfhvdrun() + extra + list(args), timeout=timeout, env=env, **kw)


def train(np: int, *script_args: str, launcher_args: Sequence[str] = (), **kw) -> Job:
    """``tfhvdrun -np N [launcher_args] python train.py [script_args]``."""
    return launch(["-np", str(np)] + list(launcher_args)
                  + [sys.executable, TRAIN] + list(script_args), **kw)


def result_line(job: Job) -> dict:
    """The ``RESULT {...}`` line rank 0 of train.py prints."""
    import json

    for line in job.out.splitlines():
        text = line.split(">:", 1)[1] if line.startswith("[") and ">:" in line else line
        if text.startswith("RESULT "):
            return json.loads(text[len("RESULT "):])
    raise AssertionError("no RESULT line: " + job.explain())
