"""``tfhvdrun --host-discovery-script ...`` (or ``--min-np``/``--max-np``): the
process layer of an elastic job.

It wires the pure :class:`~tfhvd.runner.elastic.driver.ElasticDriver` to the
world: a discovery thread (every second), the HTTP service workers talk to,
one process per worker (local, or over ssh for other hosts) with its output
tagged ``[host:slot]<stdout>:``, and a thread per process that reports its
exit status.
"""

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, TextIO

from tfhvd.runner import hosts as hostlib
from tfhvd.runner.args import elastic_timeout, settings_env
from tfhvd.runner.elastic import worker as wk
from tfhvd.runner.elastic.discovery import FixedHosts, HostDiscovery, HostDiscoveryScript, \
    HostManager
from tfhvd.runner.elastic.driver import DISCOVER_HOSTS_FREQUENCY_S, ElasticDriver, World, \
    split_id
from tfhvd.runner.elastic.service import ElasticService

TERMINATE_GRACE_S = 5.0
EXIT_GRACE_S = 3.0
# Hook for the data plane: extra variables every worker of a world gets (the
# Gloo rendezvous of that round).  Set by the backend's launcher module.
WorldEnv = Callable[[World], Dict[str, str]]


def make_discovery(args: argparse.Namespace) -> HostDiscovery:
    """The discovery script, or the fixed ``-H`` hosts (default localhost:-np)."""
    if args.host_discovery_script:
        return HostDiscoveryScript(args.host_discovery_script, args.slots)
    hosts = hostlib.parse_hosts(args.hosts) if args.hosts else \
        hostlib.default_hosts(args.max_num_proc or args.num_proc)
    return FixedHosts({h.hostname: h.slots for h in hosts})


def _driver_addr(env: Mapping[str, str]) -> str:
    explicit = env.get("TFHVD_ELASTIC_DRIVER_ADDR")
    if explicit:
        return explicit
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class ElasticJob:
    """One elastic job: driver, service, discovery thread and worker processes."""

    def __init__(self, args: argparse.Namespace, env: Mapping[str, str],
                 stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                 on_line: Optional[Callable[[str, str, str], bool]] = None,
                 world_env: Optional[WorldEnv] = None) -> None:
        self.args = args
        self.env = dict(env)
        self.out = stdout or sys.stdout
        self.err = stderr or sys.stderr
        self.on_line = on_line
        self.procs: Dict[str, subprocess.Popen] = {}
        self.pumps: List[threading.Thread] = []
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.hosts = HostManager(make_discovery(args), args.cooldown_range)
        self.driver = ElasticDriver(
            self.hosts, np=args.num_proc, min_np=args.min_num_proc or args.num_proc,
            max_np=args.max_num_proc, spawn=self._spawn, terminate=self._terminate,
            timeout=elastic_timeout(args, self.env), reset_limit=args.reset_limit,
            world_env=world_env, notice=self._notice)
        self.service = ElasticService(self.driver)
        self.addr = "%s:%d" % (_driver_addr(self.env), self.service.port)

    def _notice(self, text: str) -> None:
        with self.write_lock:
            self.err.write("tfhvdrun: %s\n" % text)
            self.err.flush()

    # ---- workers ----------------------------------------------------------
    def worker_env(self, wid: str, world: World) -> Dict[str, str]:
        """The environment of a new worker ``wid`` of ``world``."""
        env = dict(self.env)
        env.update(settings_env(self.args))
        host = split_id(wid)[0]
        env.update({wk.ELASTIC_ENV: "1", wk.DRIVER_ENV: self.addr, wk.WORKER_ENV: wid,
                    "HOROVOD_HOSTNAME": host, "PYTHONUNBUFFERED": "1"})
        info = dict(world.info[wid], round=world.round)
        for key in wk.TOPOLOGY_ENV:
            env["HOROVOD_" + key.upper()] = env["TFHVD_" + key.upper()] = str(info[key])
        env[wk.ROUND_ENV] = str(world.round)
        if self.driver.world_env is not None:
            env.update(self.driver.world_env(world))
        return env

    def _command(self, wid: str, env: Dict[str, str]) -> List[str]:
        host = split_id(wid)[0]
        if hostlib.is_local_host(host):
            return list(self.args.command)
        ssh = hostlib.ssh_base_command(hostlib.rsh_agent(self.env, []), self.args.ssh_port,
                                       self.args.ssh_identity_file)
        exports = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(env.items())
                           if k.startswith(("TFHVD_", "HOROVOD_", "PYTHON", "TF_"))
                           or k in ("PATH", "LD_LIBRARY_PATH"))
        remote = "cd %s && env %s %s" % (shlex.quote(os.getcwd()), exports,
                                         " ".join(shlex.quote(c) for c in self.args.command))
        return ssh + ["-o", "BatchMode=yes", host, remote]

    def _spawn(self, wid: str, world: World) -> None:
        env = self.worker_env(wid, world)
        proc = subprocess.Popen(self._command(wid, env), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        with self.lock:
            self.procs[wid] = proc
        for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            t = threading.Thread(target=self._pump, args=(wid, pipe, name), daemon=True)
            t.start()
            self.pumps.append(t)
        threading.Thread(target=self._watch, args=(wid, proc), daemon=True).start()

    def _pump(self, wid: str, pipe, stream: str) -> None:
        sink = self.out if stream == "stdout" else self.err
        for raw in iter(pipe.readline, b""):
            text = raw.decode(errors="replace").rstrip("\n")
            if self.on_line is not None and self.on_line(wid, stream, text):
                continue
            with self.write_lock:
                sink.write("[%s]<%s>:%s\n" % (wid, stream, text))
                sink.flush()
        pipe.close()

    def _watch(self, wid: str, proc: subprocess.Popen) -> None:
        code = proc.wait()
        with self.lock:
            if self.procs.get(wid) is proc:
                del self.procs[wid]
        self.driver.worker_exited(wid, code)

    def _terminate(self, wid: str) -> None:
        with self.lock:
            proc = self.procs.get(wid)
        if proc is None or proc.poll() is not None:
            return

        def stop() -> None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        threading.Thread(target=stop, daemon=True).start()

    # ---- the job ----------------------------------------------------------
    def _discover(self) -> None:
        while not self.driver.done:
            self.driver.poll_hosts()
            with self.driver.cond:
                if not self.driver.done:
                    self.driver.cond.wait(DISCOVER_HOSTS_FREQUENCY_S)

    def run(self, timeout: Optional[float] = None) -> int:
        """Runs the job to its end; returns its exit code (0: every worker of the
        last world returned 0)."""
        error: Optional[str] = None
        timer = None
        if timeout:
            def expire() -> None:
                with self.driver.cond:
                    self.driver._finish("tfhvdrun: the job ran longer than %g s and was "
                                        "stopped" % timeout)
            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()
        try:
            self.driver.start()
            threading.Thread(target=self._discover, daemon=True,
                             name="tfhvd-elastic-discovery").start()
            error = self.driver.wait()
        except Exception as e:  # noqa: BLE001 - a job that could not start
            error = str(e)
            with self.driver.cond:
                self.driver._finish(error)
        finally:
            if timer is not None:
                timer.cancel()
            self._stop_all()
            self.service.stop()
            for t in list(self.pumps):
                t.join(timeout=5)
        if error:
            self.err.write("%s\n" % (error if error.startswith("tfhvd") else
                                     "tfhvdrun: elastic job failed: " + error))
            self.err.flush()
            return 124 if "ran longer than" in error else 1
        return 0

    def _stop_all(self) -> None:
        with self.lock:
            procs = list(self.procs.items())
        # Workers that were told the job ended exit by themselves; give them
        # a moment to say why before stopping what is left.
        deadline = time.monotonic() + EXIT_GRACE_S
        for _, proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for wid, _ in procs:
            self._terminate(wid)
        for _, proc in procs:
            try:
                proc.wait(TERMINATE_GRACE_S * 2)
            except subprocess.TimeoutExpired:
                pass


def run_elastic(args: argparse.Namespace, env: Mapping[str, str], **kwargs) -> int:
    """``tfhvdrun``'s elastic mode; returns the job's exit code."""
    return ElasticJob(args, env, **kwargs).run()
