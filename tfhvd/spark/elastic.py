"""``tfhvd.spark.run_elastic``: an elastic tfhvd job whose slots are Spark tasks.

The job is tfhvd's own elastic driver (:mod:`tfhvd.runner.elastic.driver`)
with Spark tasks in place of hosts' slots:

* ``max_np`` Spark tasks run in one ordinary (not barrier) stage, so Spark
  retries a task that fails instead of aborting the stage.  Each task is an
  *agent*: it registers on the driver's rendezvous server (host and process
  id), sends a heartbeat every second, and waits for commands there
  (long polls, no busy waiting).
* Discovery: as in Horovod, every attempt of every task is a host of one
  slot (:func:`task_host`).  A host whose worker failed is blacklisted for the
  rest of the job, so the job goes on smaller (down to ``min_np``); a retried
  task is a new attempt, a new host, and brings the capacity back, when
  Spark retries it (``spark.task.maxFailures``, and its exclusion settings,
  ``spark.excludeOnFailure.*``, allow the executor or node).  An agent whose
  heartbeat stops for :data:`LOST_AFTER_S` seconds is lost, and so is the
  worker it ran.  A failed job raises a WorkerError whose message starts
  with Horovod's :data:`FAILED_MESSAGE`.
* The driver's ``spawn`` sends an idle agent on the worker's host the
  worker's environment; the agent runs ``fn`` in its own process (whose
  ``hvd.elastic.run`` talks to the driver as under tfhvdrun) and reports the
  result, the traceback, or that the worker left the job.  ``terminate``
  makes the agent's process exit, which Spark sees as a failed task.
* At the end every agent is told to stop, and the Spark job finishes.  An
  agent whose task ends says so (the ``ended`` scope); once every agent has
  ended or is lost, the tasks left are ones that never started (Spark's
  exclusion settings may leave a retried task nowhere to run), and the driver
  cancels the Spark job at once instead of waiting for it.
* Spark may run a later job's task in the same Python worker: each worker
  shuts tfhvd and its host-update listener down when ``fn`` ends, and the
  agent gives the process its environment and working directory back
  (:func:`~tfhvd.runner.engines.restored_after_job`).

Recovery needs Spark to retry failed tasks: ``spark.task.maxFailures`` > 1
(the default on a cluster and in ``local-cluster``; ``local[N, F]`` in local
mode).
"""

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import cloudpickle

from tfhvd.runner.elastic.discovery import HostDiscovery, HostManager
from tfhvd.runner.elastic.driver import ElasticDriver, World, split_id
from tfhvd.runner.elastic.engine import WorldScopes, job_outcome, member_env, run_driver
from tfhvd.runner.elastic.service import ElasticService
from tfhvd.runner.engines import LOOPBACK, WorkerError, call_as_rank, engine_bind, node_address, \
    own_session, restored_after_job, session_mode
from tfhvd.runner.gloo.rendezvous import RendezvousServer, kv_get, kv_put
from tfhvd.common.secret import secret_env
from tfhvd.spark.output import DriverOutput, RankOutput

LOST_AFTER_S = 8.0     # an agent silent this long is lost
_WATCH_S = 0.25        # how often the driver reads registrations, beats and reports
_ENDED_GRACE_S = 3.0   # every agent ended: how long the Spark job may take to finish
# How a failed job's error starts: Horovod's words, which its programs match.
FAILED_MESSAGE = "Horovod detected that one or more processes exited with non-zero status"


def task_host(node: str, partition: int, attempt: int) -> str:
    """The elastic host of one attempt of one Spark task: ``node/tP.A``.

    As in Horovod's elastic Spark jobs, every task attempt is a host of its
    own: a host whose worker failed is blacklisted for the rest of the job,
    and only Spark brings the capacity back, by retrying the task (a new
    attempt, a new host) where its exclusion settings allow."""
    return "%s/t%d.%d" % (node, partition, attempt)


def _scopes(job: str) -> Dict[str, str]:
    return {k: "%s-%s" % (job, k) for k in ("agents", "beats", "cmd", "reports", "kill",
                                             "ended")}


def _run_worker(env: Dict[str, str], fn: Callable, args: Sequence, kwargs: Dict,
                output: Tuple[str, int, str]) -> Tuple[str, int, Any]:
    """Runs one elastic worker in this process: (status, rank, value or traceback)."""
    from tfhvd.spark.runner import _shutdown_tfhvd

    rank = int(env["HOROVOD_RANK"])
    with restored_after_job():
        os.environ.update(env)
        try:
            own_session()
            with RankOutput(*output, rank=rank):
                value = call_as_rank(rank, fn, args, kwargs)
            return "done", int(os.environ.get("HOROVOD_RANK", "-1")), value
        except WorkerError as e:
            if isinstance(e.__cause__, SystemExit) and not e.__cause__.code:
                return "left", -1, None  # not part of the next world
            return "failed", e.rank, e.worker_traceback or str(e)
        finally:
            # Before the environment goes back: tfhvd, and the elastic
            # listener that polls this job's driver, end with the worker.
            _shutdown_tfhvd()


def _agent(payload: bytes, addr: str, port: int, job: str, host: Optional[str],
           secret: str) -> Callable:
    """The function each Spark task runs (sent to the executors, with the
    job's secret in its closure: the agent signs its requests with it)."""

    def run_partition(_rows):
        from pyspark import TaskContext

        # The job's secret (which its requests are signed with) and what the
        # workers leave behind end with the task: Spark may reuse this process.
        with restored_after_job():
            os.environ.update(secret_env(secret))
            ctx = TaskContext.get()
            me = "%d.%d" % (ctx.partitionId(), ctx.attemptNumber())
            sc = _scopes(job)
            # Each attempt of each task is a host of its own (Horovod's model).
            kv_put(addr, port, sc["agents"], me, json.dumps(
                {"host": task_host(host or node_address(), ctx.partitionId(),
                                   ctx.attemptNumber()), "pid": os.getpid()}).encode())
            stopped = threading.Event()

            def say_ended() -> None:  # the driver need not wait for this task any more
                try:
                    kv_put(addr, port, sc["ended"], me, b"1", secret=secret)
                except OSError:
                    pass

            def beat() -> None:
                n = 0
                while not stopped.is_set():
                    try:
                        if kv_get(addr, port, sc["kill"], me, wait_ms=1000,
                                  secret=secret) is not None:
                            say_ended()
                            os._exit(1)  # the driver stops this worker: the task fails
                        kv_put(addr, port, sc["beats"], me, str(n).encode(), secret=secret)
                    except OSError:
                        time.sleep(1.0)  # the driver is gone or busy: the command loop decides
                    n += 1

            threading.Thread(target=beat, daemon=True, name="tfhvd-spark-beat").start()
            fn, args, kwargs = cloudpickle.loads(payload)
            n, unreachable_since = 0, None
            try:
                while True:
                    try:
                        raw = kv_get(addr, port, sc["cmd"], "%s.%d" % (me, n), wait_ms=1000)
                        unreachable_since = None
                    except OSError:
                        unreachable_since = unreachable_since or time.monotonic()
                        if time.monotonic() - unreachable_since > 60:
                            break  # the driver went away without a word
                        time.sleep(1.0)
                        continue
                    if raw is None:
                        continue
                    cmd = cloudpickle.loads(raw)
                    if cmd[0] == "stop":
                        break
                    _, wid, env = cmd
                    status, rank, value = _run_worker(env, fn, args, kwargs, (addr, port, job))
                    kv_put(addr, port, sc["reports"], "%s.%d" % (me, n),
                           cloudpickle.dumps((wid, status, rank, value)))
                    n += 1
                    if status == "failed":
                        # As Horovod's tasks do: the task fails, and Spark decides
                        # whether (and where) a new attempt, a new host, runs.
                        raise RuntimeError("tfhvd.spark: the worker of this task (rank %d) failed; "
                                           "failing the task so that Spark may retry it" % rank)
            finally:
                stopped.set()
                say_ended()
        yield me

    return run_partition


@dataclass
class _Agent:
    host: str
    pid: int
    beat: bytes = b""
    heard: float = field(default_factory=time.monotonic)
    commands: int = 0
    wid: Optional[str] = None
    lost: bool = False
    stopped: bool = False


class _SparkAgents(HostDiscovery):
    """Hosts and slots: the live agents, by host."""

    def __init__(self, job: "_SparkElasticJob") -> None:
        self.job = job

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        with self.job.lock:
            for a in self.job.agents.values():
                if not a.lost:
                    out[a.host] = out.get(a.host, 0) + 1
        return out


class _SparkElasticJob:
    def __init__(self, sc: Any, fn: Callable, args: Sequence, kwargs: Mapping, np_: int,
                 min_np: int, max_np: int, start_timeout: int, elastic_timeout: float,
                 reset_limit: Optional[int], env: Mapping[str, str],
                 nics: Optional[Sequence[str]], verbose: int, stdout: Any = None,
                 stderr: Any = None, timestamp: bool = False) -> None:
        self.sc, self.max_np, self.verbose = sc, max_np, verbose
        self.local = (sc.master or "").startswith("local")
        self.addr = LOOPBACK if self.local else sc.getConf().get("spark.driver.host", LOOPBACK)
        self.iface = "lo" if self.local else (list(nics)[0] if nics else None)
        self.extra = {str(k): str(v) for k, v in env.items()}
        self.start_timeout = start_timeout
        self.job = "spark-elastic-" + uuid.uuid4().hex[:12]
        self.scopes = _scopes(self.job)
        self.payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs)))
        self.lock = threading.RLock()
        self.agents: Dict[str, _Agent] = {}
        self.seen_reports: set = set()
        self.results: Dict[str, Tuple[int, Any]] = {}
        self.errors: Dict[str, str] = {}
        self.spark_error: Optional[BaseException] = None
        bind = LOOPBACK if self.local else engine_bind(self.addr)
        self.rendezvous = RendezvousServer(bind)
        self.port = self.rendezvous.start()
        self.world_scopes = WorldScopes(self.rendezvous.store, "%s-gloo" % self.job)
        self.driver = ElasticDriver(HostManager(_SparkAgents(self), None), np=np_,
                                    min_np=min_np, max_np=max_np, spawn=self._spawn,
                                    terminate=self._terminate, timeout=elastic_timeout,
                                    reset_limit=reset_limit, world_env=self.world_scopes)
        self.service = ElasticService(self.driver, bind, secret=self.rendezvous.secret)
        self.output = DriverOutput(self.rendezvous.store, self.job, stdout, stderr, timestamp)

    # ---- the driver's callbacks -------------------------------------------
    def _command(self, name: str, agent: _Agent, cmd: Tuple) -> None:
        self.rendezvous.store.put(self.scopes["cmd"], "%s.%d" % (name, agent.commands),
                                  cloudpickle.dumps(cmd))
        agent.commands += 1

    def _spawn(self, wid: str, world: World) -> None:
        host = split_id(wid)[0]
        env = member_env(world, wid, self.service, self.addr, self.port, self.extra,
                         self.start_timeout, self.iface, self.world_scopes(world))
        with self.lock:
            idle = sorted(n for n, a in self.agents.items()
                          if a.host == host and a.wid is None and not a.lost)
            if idle:
                agent = self.agents[idle[0]]
                agent.wid = wid
                self._command(idle[0], agent, ("run", wid, env))
                return
        # The agent behind this slot was lost since discovery counted it.
        threading.Thread(target=self.driver.worker_exited, args=(wid, 1), daemon=True).start()

    def _terminate(self, wid: str) -> None:
        with self.lock:
            for name, a in self.agents.items():
                if a.wid == wid and not a.lost:
                    self.rendezvous.store.put(self.scopes["kill"], name, b"1")

    # ---- watching the agents ------------------------------------------------
    def _watch(self) -> None:
        while not self.driver.done:
            exited = self._read_store(time.monotonic())
            for wid, code in exited:
                self.driver.worker_exited(wid, code)
            time.sleep(_WATCH_S)

    def _read_store(self, now: float) -> List[Tuple[str, int]]:
        store = self.rendezvous.store
        exited: List[Tuple[str, int]] = []
        with self.lock:
            for name, raw in store.items(self.scopes["agents"]).items():
                if name not in self.agents:
                    info = json.loads(raw.decode())
                    self.agents[name] = _Agent(info["host"], int(info["pid"]))
            beats = store.items(self.scopes["beats"])
            for name, a in self.agents.items():
                if a.lost:
                    continue
                if beats.get(name, b"") != a.beat:
                    a.beat, a.heard = beats.get(name, b""), now
                elif now - a.heard > LOST_AFTER_S:
                    a.lost = True
                    if a.wid is not None:
                        self.errors[a.wid] = "its Spark task (agent %s, pid %d) was lost" \
                            % (name, a.pid)
                        exited.append((a.wid, 1))
                        a.wid = None
            for key, raw in store.items(self.scopes["reports"]).items():
                if key in self.seen_reports:
                    continue
                self.seen_reports.add(key)
                wid, status, rank, value = cloudpickle.loads(raw)
                agent = self.agents.get(key.rsplit(".", 1)[0])
                if agent is not None and agent.wid == wid:
                    agent.wid = None
                if status == "done":
                    self.results[wid] = (rank, value)
                elif status == "failed":
                    self.errors[wid] = "rank %d raised:\n%s" % (rank, value)
                exited.append((wid, 1 if status == "failed" else 0))
        return exited

    def _spark_job(self) -> None:
        host = LOOPBACK if self.local else None
        task = _agent(self.payload, self.addr, self.port, self.job, host,
                      self.rendezvous.secret)
        self.sc.setJobGroup(self.job, "tfhvd.spark.run_elastic: up to %d ranks" % self.max_np,
                            interruptOnCancel=True)
        try:
            self.sc.parallelize(range(self.max_np), self.max_np).mapPartitions(task).collect()
        except BaseException as e:  # noqa: BLE001 - reported by run()
            self.spark_error = e
            with self.driver.cond:
                self.driver._finish("the Spark job of the agents failed: %s"
                                    % str(e).splitlines()[0][:300])

    # ---- the job ------------------------------------------------------------
    def run(self) -> List[Any]:
        spark = threading.Thread(target=self._spark_job, daemon=True, name="tfhvd-spark-job")
        spark.start()
        self.output.start()
        threading.Thread(target=self._watch, daemon=True, name="tfhvd-spark-watch").start()
        try:
            error = run_driver(self.driver, discover_first=True)
        finally:
            self._stop_agents(spark)
            if spark.is_alive():
                self.sc.cancelJobGroup(self.job)
                spark.join(timeout=30)
            self.output.close()
            self.service.stop()
            self.rendezvous.stop()
        with self.lock:
            try:
                return job_outcome("spark", error, dict(self.errors), dict(self.results))
            except WorkerError as e:
                raise WorkerError("%s: %s" % (FAILED_MESSAGE, e), e.rank,
                                  e.worker_traceback) from None

    def _stop_agents(self, spark: threading.Thread) -> None:
        """Tells every agent to stop (kills those still running a worker) and
        waits up to 60 s for the Spark job to end; once every agent has ended
        or is lost, only :data:`_ENDED_GRACE_S` more (the tasks left never
        started, and run() cancels the job)."""
        deadline = time.monotonic() + 60
        while spark.is_alive() and time.monotonic() < deadline:
            self._read_store(time.monotonic())  # tasks that registered late stop too
            ended = self.rendezvous.store.items(self.scopes["ended"])
            with self.lock:
                if all(a.lost or name in ended for name, a in self.agents.items()):
                    # A job whose tasks all ran ends by itself within moments.
                    deadline = min(deadline, time.monotonic() + _ENDED_GRACE_S)
                for name, a in self.agents.items():
                    if a.lost or a.stopped:
                        continue
                    a.stopped = True
                    if a.wid is not None:  # still running after the job ended
                        self.rendezvous.store.put(self.scopes["kill"], name, b"1")
                    else:
                        self._command(name, a, ("stop",))
            spark.join(timeout=_WATCH_S)


def run_elastic(fn: Callable, args: Sequence = (), kwargs: Optional[Mapping] = None,
                num_proc: Optional[int] = None, min_num_proc: Optional[int] = None,
                max_num_proc: Optional[int] = None, start_timeout: Optional[int] = None,
                elastic_timeout: Optional[float] = None, reset_limit: Optional[int] = None,
                env: Optional[Mapping[str, str]] = None, stdout: Any = None,
                stderr: Any = None, verbose: int = 1,
                nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
                min_np: Optional[int] = None, max_np: Optional[int] = None,
                executable: Optional[str] = None) -> List[Any]:
    """Runs ``fn(*args, **kwargs)``, which uses ``hvd.elastic.run``, as an
    elastic tfhvd job on Spark tasks (see the module docstring); returns the
    results of the workers of the last world in rank order.

    ``num_proc`` (default ``defaultParallelism``) workers first, between
    ``min_np`` and ``max_np`` (Horovod's ``min_num_proc``/``max_num_proc``
    too; both default to ``num_proc``) later; ``max_np`` Spark tasks are
    started.  ``elastic_timeout`` (``HOROVOD_ELASTIC_TIMEOUT``, 600 s) bounds a
    wait for slots, ``start_timeout`` (``HOROVOD_SPARK_START_TIMEOUT``, 600 s)
    each world's rendezvous, ``reset_limit`` the resets.  ``stdout``/``stderr``:
    where the ranks' Python output is shown on the driver, as in
    :func:`~tfhvd.spark.run`, with ``prefix_output_with_timestamp`` and
    ``executable`` as there.  Raises
    :class:`WorkerError` when the job fails.
    """
    from pyspark import SparkContext

    from tfhvd.spark.runner import check_executable
    from tfhvd.spark.workers import prepare_workers

    sc = SparkContext.getOrCreate()
    check_executable(sc, executable, "run_elastic")
    n = int(num_proc or sc.defaultParallelism)
    lo = int(min_num_proc if min_num_proc is not None else (min_np if min_np is not None else n))
    hi = int(max_num_proc if max_num_proc is not None else (max_np if max_np is not None else n))
    if not 1 <= lo <= n <= hi:
        raise ValueError("tfhvd.spark.run_elastic needs 1 <= min_np (%d) <= num_proc (%d) <= "
                         "max_np (%d)" % (lo, n, hi))
    timeout = int(start_timeout or os.environ.get("HOROVOD_SPARK_START_TIMEOUT") or 600)
    elastic = float(elastic_timeout or os.environ.get("HOROVOD_ELASTIC_TIMEOUT") or 600)
    session_mode(dict(env or {}), "tfhvd.spark.run_elastic(env=...)")
    job = _SparkElasticJob(sc, fn, args, dict(kwargs or {}), n, lo, hi, timeout, elastic,
                           reset_limit, dict(env or {}), nics, verbose, stdout, stderr,
                           prefix_output_with_timestamp)
    if verbose >= 2:
        print("tfhvd.spark: elastic job of %d..%d ranks, driver at %s" % (lo, hi, job.addr))
    with prepare_workers(sc, "run_elastic"):
        return job.run()
