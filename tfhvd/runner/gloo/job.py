"""A whole Gloo job: rendezvous server, workers, their output, their end.

:func:`run_gloo_job` is what ``tfhvdrun --gloo`` runs.  It

1. starts a :class:`~tfhvd.runner.gloo.rendezvous.RendezvousServer`;
2. starts one :class:`~tfhvd.runner.gloo.workers.Worker` per rank, local or
   over ssh, each with Horovod's launch variables (see ``workers.worker_env``);
3. copies each rank's lines to the terminal tagged ``[1,RANK]<stdout>:`` as
   ``mpirun --tag-output`` does (so the same tools read both launchers'
   output), through the same :class:`~tfhvd.runner.output.LineSink`;
4. watches the ranks: the first one to exit non-zero (or be killed) ends the
   job at once: every other rank gets SIGTERM, then SIGKILL after
   ``grace_s``; the job's exit code is that rank's (128+N for signal N), and
   the failed rank is named.  SIGINT/SIGTERM to the launcher end every rank.
"""

import os
import signal
import sys
import threading
import time
from typing import Callable, List, Mapping, Optional, Sequence, TextIO

from tfhvd.runner.common import (  # noqa: F401  (launcher_address, iface_of re-exported)
    Slot, bind_address, iface_of, launcher_address, worker_env)
from tfhvd.runner.gloo.rendezvous import RendezvousServer
from tfhvd.common.secret import job_secret, secret_env
from tfhvd.runner.gloo.workers import Worker, remote_command, remote_env_line
from tfhvd.runner.hosts import is_local_host
from tfhvd.runner.output import FailureTracker, Line, LineSink

_GRACE_S = 10.0


class _Pump(threading.Thread):
    """Reads one pipe of one rank and emits tagged lines."""

    def __init__(self, worker: Worker, pipe, stream: str, sink: LineSink) -> None:
        super().__init__(daemon=True)
        self._rank, self._pipe, self._stream, self._sink = worker.rank, pipe, stream, sink

    def run(self) -> None:
        tag = "[1,%d]<%s>:" % (self._rank, self._stream)
        for raw in iter(self._pipe.readline, b""):
            text = raw.decode(errors="replace").rstrip("\n")
            self._sink.emit([Line(self._rank, self._stream, text, tag)], self._stream)
        self._pipe.close()


class GlooJob:
    """The workers of one job and how they end (reusable by a driver)."""

    def __init__(self, sink: LineSink, tracker: FailureTracker, err: TextIO) -> None:
        self.workers: List[Worker] = []
        self._sink, self._tracker, self._err = sink, tracker, err
        self._pumps: List[_Pump] = []
        self._stop = threading.Event()
        self.first_failure: Optional[Worker] = None

    def spawn(self, slot: Slot, argv: Sequence[str], env: Mapping[str, str],
              remote: bool, stdin_line: Optional[str] = None) -> Worker:
        """Starts one rank and the readers of its output (``stdin_line``: the
        job's secret, which a remote rank reads from its ssh's stdin)."""
        w = Worker(slot, argv, env, remote, stdin_line)
        self.workers.append(w)
        for pipe, stream in ((w.proc.stdout, "stdout"), (w.proc.stderr, "stderr")):
            p = _Pump(w, pipe, stream, self._sink)
            p.start()
            self._pumps.append(p)
        return w

    def request_stop(self) -> None:
        """Ends the job (Ctrl-C, a driver's decision): every rank is stopped."""
        self._stop.set()

    def wait(self, timeout: Optional[float] = None,
             on_exit: Optional[Callable[[Worker, int], None]] = None,
             stop_on_failure: bool = True) -> Optional[int]:
        """Waits for every rank.  Returns the job's exit code, or None when
        ``timeout`` passed first (the ranks are then stopped).  ``on_exit``
        sees each rank's exit; with ``stop_on_failure`` (tfhvdrun's rule)
        the first failure stops the other ranks, without it (a driver that
        replaces lost workers) they keep running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(self.workers)
        while pending:
            if self._stop.is_set():
                self.stop_all()
                return 130
            if deadline is not None and time.monotonic() > deadline:
                self.stop_all()
                return None
            exited = []
            for w in list(pending):
                code = w.poll()
                if code is None:
                    continue
                pending.remove(w)
                exited.append((w, code))
                if on_exit is not None:
                    on_exit(w, code)
            failed = [(w, code) for w, code in exited if code != 0]
            if failed and self.first_failure is None:
                # Exits seen in one sweep happened within 0.2 s of each other:
                # a rank killed by a signal is the likelier cause (its peers
                # then fail on the lost connection), else the lowest rank.
                w, code = min(failed, key=lambda wc: (wc[1] >= 0, wc[0].rank))
                self.first_failure = w
                for other, other_code in [(w, code)] + [f for f in failed if f[0] is not w]:
                    self._tracker.record_exit(other.rank, other_code, other.slot.hostname)
                self._err.write("tfhvdrun: rank %d (%s) %s%s\n" % (
                    w.rank, w.slot.hostname, _describe(code),
                    "; stopping the other ranks" if stop_on_failure else ""))
                self._err.flush()
                if stop_on_failure:
                    self.stop_all()
            # Sleeps between looks: exits are rare events, a few per job.
            self._stop.wait(0.2)
        return self.exit_code()

    def exit_code(self) -> int:
        w = self.first_failure
        if w is None:
            return 0
        code = w.poll() or 1
        return 128 - code if code < 0 else code

    def stop_all(self, grace_s: float = _GRACE_S) -> None:
        """SIGTERM to every live rank, SIGKILL to those alive after ``grace_s``."""
        live = [w for w in self.workers if w.poll() is None]
        for w in live:
            w.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(w.poll() is None for w in live) and time.monotonic() < deadline:
            time.sleep(0.1)
        for w in live:
            if w.poll() is None:
                w.signal(signal.SIGKILL)
        for w in live:
            try:
                w.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - best effort at the end
                pass

    def join_output(self) -> None:
        """Waits (10 s at most in all) for the ranks' last output lines."""
        end = time.monotonic() + 10
        for p in self._pumps:
            p.join(timeout=max(0.0, end - time.monotonic()))
        self._sink.close()


def _describe(code: int) -> str:
    if code < 0:
        try:
            return "was killed by signal %d (%s)" % (-code, signal.Signals(-code).name)
        except ValueError:
            return "was killed by signal %d" % -code
    return "exited with code %d" % code


def run_gloo_job(command: Sequence[str], slots: Sequence[Slot], env: Mapping[str, str],
                 extra_env: Mapping[str, str], ssh: Sequence[str],
                 iface: Optional[str] = None, output_dir: Optional[str] = None,
                 stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 timeout: Optional[float] = None, verbose: bool = False,
                 on_line: Optional[Callable[[Line], bool]] = None,
                 tracker: Optional[FailureTracker] = None) -> int:
    """Runs ``command`` once per slot and returns the job's exit code
    (``on_line``, ``tracker`` and ``timeout`` as for ``launch.run_job``)."""
    out, err = stdout or sys.stdout, stderr or sys.stderr
    hosts = sorted({s.hostname for s in slots})
    local = {h: is_local_host(h) for h in hosts}
    remote = [h for h in hosts if not local[h]]
    tracker = tracker if tracker is not None else FailureTracker()
    sink = LineSink(out, err, tracker, on_line, output_dir)
    job = GlooJob(sink, tracker, err)
    # One secret for the whole job (the user's TFHVD_SECRET_KEY, else a new
    # one); the server listens on the address the ranks are given, loopback
    # for a job on this host (docs/security.md).
    addr = launcher_address(remote, iface)
    server = RendezvousServer(bind_address(addr, env), secret=job_secret(env), log=err)
    port = server.start()
    extra_env = dict(extra_env, **secret_env(server.secret))
    # A job on this host only runs Gloo over loopback unless told otherwise;
    # a multi-host job without --network-interface uses the interface that
    # reaches the first remote host here (the hosts must name it alike).
    gloo_iface = iface or (iface_of(addr) if remote else "lo")
    if verbose:
        err.write("tfhvdrun: Gloo rendezvous at %s:%d, %d ranks on %s\n"
                  % (addr, port, len(slots), ", ".join(hosts)))
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, lambda *_: job.request_stop())
    code: Optional[int] = 0
    try:
        cwd = os.getcwd()
        for slot in slots:
            wenv = worker_env(env, slot, len(slots), addr, port, gloo_iface, extra_env)
            if local[slot.hostname]:
                job.spawn(slot, command, wenv, remote=False)
            else:
                job.spawn(slot, remote_command(ssh, slot.hostname, command, wenv, cwd), env,
                          remote=True, stdin_line=remote_env_line(wenv, server.secret))
        code = job.wait(timeout)
    finally:
        if any(w.poll() is None for w in job.workers):
            job.stop_all()
        for s, h in previous.items():
            signal.signal(s, h)
        job.join_output()
        server.stop()
    if code is None:
        err.write("tfhvdrun: the job ran longer than %g s and was stopped.\n" % timeout)
        code = 124
    elif code == 130:
        err.write("tfhvdrun: interrupted; every rank was stopped.\n")
    if code != 0:
        err.write(tracker.summary(code) + "\n")
    err.flush()
    return code
