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
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, TextIO

from tfhvd.runner import hosts as hostlib
from tfhvd.runner.args import elastic_timeout, settings_env, start_timeout
from tfhvd.common import elastic_worker as wk
from tfhvd.runner.elastic.discovery import FixedHosts, HostDiscovery, HostDiscoveryScript, \
    HostManager
from tfhvd.runner.elastic.driver import DISCOVER_HOSTS_FREQUENCY_S, ElasticDriver, World, \
    split_id
from tfhvd.runner.elastic.service import ElasticService
from tfhvd.runner.common import Slot, bind_address, launcher_address, worker_env
from tfhvd.runner.gloo.rendezvous import RendezvousServer
from tfhvd.runner.gloo.workers import Worker, remote_command, remote_env_line
from tfhvd.common.secret import job_secret, secret_env

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


def _scope(round_: int) -> str:
    return "elastic-%d" % round_


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
        self.procs: Dict[str, Worker] = {}
        self.pumps: List[threading.Thread] = []
        self._spawn_queue: "queue.Queue" = queue.Queue()
        self._spawn_thread = threading.Thread(target=self._spawner, daemon=True,
                                              name="tfhvd-elastic-spawner")
        self._spawn_thread.start()
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.hosts = HostManager(make_discovery(args), args.cooldown_range)
        self.driver = ElasticDriver(
            self.hosts, np=args.num_proc, min_np=args.min_num_proc or args.num_proc,
            max_np=args.max_num_proc, spawn=self._spawn, terminate=self._terminate,
            timeout=elastic_timeout(args, self.env), reset_limit=args.reset_limit,
            world_env=world_env or self._world_env, notice=self._notice)
        # Gloo's rendezvous store (one scope per world) and the driver's
        # endpoints, at an address every host reaches: loopback when the hosts
        # known at start are all this machine's (set TFHVD_ELASTIC_DRIVER_ADDR,
        # or --network-interface, when remote hosts only join later).
        self.iface = args.network_interface.split(",")[0] if args.network_interface else None
        first = self.hosts.discovery.find_available_hosts_and_slots()
        remote_hosts = [h for h in first if not hostlib.is_local_host(h)]
        explicit = self.env.get("TFHVD_ELASTIC_DRIVER_ADDR")
        self.remote = bool(remote_hosts or explicit or self.iface)
        self.host_addr = explicit or (launcher_address(remote_hosts, self.iface)
                                      if self.remote else "127.0.0.1")
        # Both servers check the job's one secret and listen only where the
        # workers are told to reach them (TFHVD_BIND_ADDR overrides).
        bind = bind_address(self.host_addr, self.env)
        self.secret = job_secret(self.env)
        self.rendezvous = RendezvousServer(bind, secret=self.secret, log=self.err)
        self.rendezvous_port = self.rendezvous.start()
        self.service = ElasticService(self.driver, bind, secret=self.secret, log=self.err)
        self.addr = "%s:%d" % (self.host_addr, self.service.port)
        self._last_round = 0

    def _notice(self, text: str) -> None:
        with self.write_lock:
            self.err.write("tfhvdrun: %s\n" % text)
            self.err.flush()

    # ---- workers ----------------------------------------------------------
    def _world_env(self, world: World) -> Dict[str, str]:
        """What a worker of ``world`` needs beyond its rank: the Gloo scope of
        that world (the previous world's scope is dropped from the store)."""
        if world.round > self._last_round:
            if self._last_round:
                self.rendezvous.store.delete_scope(_scope(self._last_round))
            self._last_round = world.round
        return {"HOROVOD_GLOO_SCOPE": _scope(world.round)}

    def worker_env(self, wid: str, world: World) -> Dict[str, str]:
        """The environment of a new worker ``wid`` of ``world``."""
        host = split_id(wid)[0]
        info = world.info[wid]
        slot = Slot(info["rank"], host, info["local_rank"], info["local_size"],
                    info["cross_rank"], info["cross_size"])
        extra = dict(settings_env(self.args))
        extra.update(secret_env(self.secret))
        extra.update({wk.ELASTIC_ENV: "1", wk.DRIVER_ENV: self.addr, wk.WORKER_ENV: wid,
                      wk.ROUND_ENV: str(world.round), "PYTHONUNBUFFERED": "1"})
        if not any(self.env.get(p + "GLOO_TIMEOUT_SECONDS") for p in ("TFHVD_", "HOROVOD_")):
            # A new world waits this long at the rendezvous for its newcomers (as
            # under tfhvdrun --gloo); a newcomer that never comes fails the wait,
            # and the survivors ask for a world without it.
            extra["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(start_timeout(self.args, self.env))
        extra.update(self.driver.world_env(world) if self.driver.world_env else {})
        iface = self.iface or (None if self.remote else "lo")
        return worker_env(self.env, slot, info["size"], self.host_addr, self.rendezvous_port,
                          iface, extra)

    def _spawn(self, wid: str, world: World) -> None:
        # Processes are started by one thread that lives as long as the job:
        # a worker's parent-death signal fires when the *thread* that forked
        # it ends, and the driver forms later worlds on short-lived threads.
        self._spawn_queue.put((wid, world, self.worker_env(wid, world)))

    def _spawner(self) -> None:
        while True:
            item = self._spawn_queue.get()
            if item is None:
                return
            self._start_worker(*item)

    def _start_worker(self, wid: str, world: World, env: Dict[str, str]) -> None:
        host = split_id(wid)[0]
        remote = not hostlib.is_local_host(host)
        argv = list(self.args.command)
        if remote:
            ssh = hostlib.ssh_base_command(hostlib.rsh_agent(self.env, []), self.args.ssh_port,
                                           os.path.abspath(self.args.ssh_identity_file)
                                           if self.args.ssh_identity_file else None)
            argv = remote_command(ssh, host, argv, env, os.getcwd())
        w = Worker(Slot(world.info[wid]["rank"], host, 0, 1, 0, 1), argv, env, remote,
                   stdin_line=remote_env_line(env, self.secret) if remote else None)
        with self.lock:
            self.procs[wid] = w
        for pipe, name in ((w.proc.stdout, "stdout"), (w.proc.stderr, "stderr")):
            t = threading.Thread(target=self._pump, args=(wid, pipe, name), daemon=True)
            t.start()
            self.pumps.append(t)
        threading.Thread(target=self._watch, args=(wid, w), daemon=True).start()

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

    def _watch(self, wid: str, w: Worker) -> None:
        code = w.proc.wait()
        with self.lock:
            if self.procs.get(wid) is w:
                del self.procs[wid]
        self.driver.worker_exited(wid, code)

    def _terminate(self, wid: str) -> None:
        with self.lock:
            w = self.procs.get(wid)
        if w is None or w.poll() is not None:
            return

        def stop() -> None:
            w.signal(signal.SIGTERM)
            try:
                w.proc.wait(TERMINATE_GRACE_S)
            except subprocess.TimeoutExpired:
                w.signal(signal.SIGKILL)

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
            # Only now: the workers' parent-death signal is tied to this thread.
            self._spawn_queue.put(None)
            self._spawn_thread.join(timeout=10)
            self.service.stop()
            self.rendezvous.stop()
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
        for _, w in procs:
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for wid, _ in procs:
            self._terminate(wid)
        for _, w in procs:
            try:
                w.proc.wait(TERMINATE_GRACE_S * 2)
            except subprocess.TimeoutExpired:
                pass


def run_elastic(args: argparse.Namespace, env: Mapping[str, str], **kwargs) -> int:
    """``tfhvdrun``'s elastic mode; returns the job's exit code."""
    return ElasticJob(args, env, **kwargs).run()
