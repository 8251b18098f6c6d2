"""``tfhvd.spark.run``: one barrier stage of ``num_proc`` tasks, one rank each.

1. The driver starts a rendezvous server (loopback when the cluster runs on
   the driver's host: ``local[N]``, ``local-cluster``; else the driver's
   address, ``spark.driver.host``).
2. ``num_proc`` tasks run in one barrier stage.  Each task reads every
   task's host from ``BarrierTaskContext.getTaskInfos()``, so all ranks
   compute the same topology (partition id = rank; local and cross ranks by
   host, as :func:`tfhvd.runner.engines.engine_slots` gives them), applies its
   :class:`~tfhvd.runner.engines.Bootstrap` and runs ``fn``.  When ``fn``
   ends (returns or raises) the task shuts tfhvd down and gives the Python
   worker back its environment and working directory, since Spark may run
   a later job's task in the same process
   (:func:`~tfhvd.runner.engines.restored_after_job`).
3. A rank that raises stores its traceback on the rendezvous server, then
   fails its task; Spark aborts a failed barrier result stage (it is never
   retried) and kills the other tasks.  The driver raises a
   :class:`~tfhvd.runner.engines.WorkerError` naming the rank Spark saw fail
   first, with that rank's traceback (or Spark's reason when the task's
   process died without one).
"""

import os
import re
import shutil
import threading
import time
import uuid
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import cloudpickle

from tfhvd.runner.engines import LOOPBACK, Bootstrap, WorkerError, call_as_rank, engine_bind, \
    engine_slots, restored_after_job, session_mode
from tfhvd.runner.gloo.rendezvous import RendezvousServer, kv_put
from tfhvd.common.secret import SECRET_ENV, secret_env
from tfhvd.spark.output import DriverOutput, RankOutput
from tfhvd.spark.workers import prepare_workers

_ERROR_SCOPE = "spark-errors"
# Where each task says it started (scope + this suffix, key = rank).
_STARTED = "-started"
START_TIMEOUT_MESSAGE = (
    "Timed out waiting for Spark tasks to start. Please check that you have enough resources "
    "to run all tfhvd processes: each rank runs in a Spark task, and %d of the %d tasks "
    "started within start_timeout=%d s (the context's defaultParallelism is %d). You may need "
    "to increase the start_timeout parameter to a larger value if your Spark resources are "
    "allocated on demand.")


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") \
        else address
    return host.strip("[]")


def _task(payload: bytes, addr_of: Dict[str, str], port: int, scope: str,
          env: Dict[str, str], start_timeout: int) -> Callable:
    """The function each barrier task runs (sent to the executors)."""

    def run_partition(_rows):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        rank = ctx.partitionId()
        hosts = [_host(t.address) for t in ctx.getTaskInfos()]
        slots = engine_slots(hosts)
        driver_host = addr_of["driver"]
        local = all(h in (driver_host, LOOPBACK, "localhost") for h in hosts)
        addr = LOOPBACK if local else driver_host
        try:  # the driver counts started tasks against start_timeout
            kv_put(addr, port, scope + _STARTED, str(rank), b"1", timeout=10,
                   secret=env[SECRET_ENV])
        except OSError:
            pass  # the rendezvous below then fails with its own error
        extra = {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(start_timeout)}
        extra.update(env)
        # Spark may run a later job in this Python worker: the rank's
        # variables, the job's env and what fn changed end with the task.
        with restored_after_job():
            Bootstrap(slots[rank], len(slots), addr, port, scope, extra,
                      iface="lo" if local else None).apply(hosts[rank])
            fn, args, kwargs = cloudpickle.loads(payload)
            try:
                with RankOutput(addr, port, scope, rank):
                    result = call_as_rank(rank, fn, args, kwargs)
            except WorkerError as e:
                _report(addr, port, rank, e.worker_traceback)
                raise
            finally:
                _shutdown_tfhvd()
        yield rank, cloudpickle.dumps(result)

    return run_partition


def _report(addr: str, port: int, rank: int, text: str) -> None:
    try:
        kv_put(addr, port, _ERROR_SCOPE, str(rank), text.encode(), timeout=5)
    except OSError:
        pass  # the driver still learns of the failure from Spark


def _shutdown_tfhvd() -> None:
    """Ends this rank's world, and its elastic job's host-update listener,
    so a Python worker Spark reuses starts the next job clean (a later
    ``hvd.elastic.run`` starts a listener of that job's driver)."""
    import sys

    basics = sys.modules.get("tfhvd.common.basics")
    if basics is not None:
        try:
            if basics.is_initialized():
                basics.shutdown()
        except Exception:  # noqa: BLE001 - the task's own result matters more
            pass
    elastic = sys.modules.get("tfhvd.common.elastic")
    if elastic is not None:
        elastic.notification_manager.shutdown()


def run(fn: Callable, args: Sequence = (), kwargs: Optional[Mapping] = None,
        num_proc: Optional[int] = None, start_timeout: Optional[int] = None,
        use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        extra_mpi_args: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
        stdout: Any = None, stderr: Any = None, verbose: int = 1,
        nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
        executable: Optional[str] = None) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` as a tfhvd job of ``num_proc`` Spark tasks
    (default: the context's ``defaultParallelism``) and returns its results
    in rank order.  The parameters are Horovod 0.28.1's, in its positional order.

    ``start_timeout`` (default ``HOROVOD_SPARK_START_TIMEOUT`` or 600 s) bounds
    the start of the Spark tasks (too few slots: a TimeoutError whose message
    starts, as Horovod's does, "Timed out waiting for Spark tasks to start.")
    and then the ranks' rendezvous.  Before any rank starts, the workers'
    Python is checked (tfhvd.spark.workers): in local mode with
    ``PYSPARK_PYTHON`` unset they run the driver's interpreter.  ``env``
    adds variables to every rank, for this job only: a Python worker Spark
    reuses for a later job has its own environment back.  The job runs
    over Gloo; ``use_mpi=True`` is refused (an MPI job needs mpirun to start
    its processes, and Spark starts them here), and ``extra_mpi_args`` is
    then meaningless and refused too.  ``stdout``/``stderr`` (default
    ``sys.stdout``/``sys.stderr``): where the ranks' Python output is shown on
    the driver, each line prefixed ``[rank]<stdout>:`` (it stays in the
    executors' logs too, with what C++ code writes); ``nics``: the
    interface Gloo uses (first one), else the one that reaches the driver;
    ``prefix_output_with_timestamp``: each forwarded line starts with the
    time the driver received it.  ``executable``: the Python the ranks
    should run; Spark's Python workers run them (``spark.pyspark.python`` or
    ``PYSPARK_PYTHON``), so a different one only gets a warning.
    """
    from pyspark import SparkContext

    if use_mpi:
        raise ValueError("tfhvd.spark.run(use_mpi=True): tfhvd runs Spark jobs over Gloo only "
                         "(the tasks are started by Spark, not by mpirun); leave use_mpi unset")
    if use_gloo is False:
        raise ValueError("tfhvd.spark.run(use_gloo=False): Gloo is the only controller of a "
                         "Spark job")
    if extra_mpi_args:
        raise ValueError("tfhvd.spark.run: extra_mpi_args=%r given, but the job runs over "
                         "Gloo, not MPI" % (extra_mpi_args,))
    sc = SparkContext.getOrCreate()
    check_executable(sc, executable, "run")
    n = int(num_proc or sc.defaultParallelism)
    if n < 1:
        raise ValueError("tfhvd.spark.run: num_proc must be at least 1, got %d" % n)
    timeout = int(start_timeout or os.environ.get("HOROVOD_SPARK_START_TIMEOUT") or 600)
    driver_host = sc.getConf().get("spark.driver.host", LOOPBACK)
    master = sc.master or ""
    local = master.startswith("local")
    server = RendezvousServer(LOOPBACK if local else engine_bind(driver_host))
    port = server.start()
    task_env = {str(k): str(v) for k, v in (env or {}).items()}
    task_env.update(secret_env(server.secret))  # in the task's closure, never argv
    session_mode(task_env, "tfhvd.spark.run(env=...)")
    if nics:
        task_env["HOROVOD_GLOO_IFACE"] = list(nics)[0]
    scope = "spark-" + uuid.uuid4().hex[:12]
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    job = _task(payload, {"driver": LOOPBACK if local else driver_host}, port, scope,
                task_env, timeout)
    group = "tfhvd-" + scope
    sc.setJobGroup(group, "tfhvd.spark.run: %d ranks" % n, interruptOnCancel=True)
    if verbose >= 2:
        print("tfhvd.spark: %d ranks, rendezvous at %s:%d"
              % (n, LOOPBACK if local else driver_host, port))
    output = DriverOutput(server.store, scope, stdout, stderr,
                          prefix_output_with_timestamp).start()
    try:
        with prepare_workers(sc, "run"):
            rdd = sc.parallelize(range(n), n).barrier().mapPartitions(job)
            outcome: Dict[str, Any] = {}
            collector = threading.Thread(target=_collect, args=(rdd, outcome),
                                         name="tfhvd-spark-collect", daemon=True)
            collector.start()
            started = _wait_started(server, scope + _STARTED, n, timeout, collector)
            if started < n:
                sc.cancelJobGroup(group)
                raise TimeoutError(START_TIMEOUT_MESSAGE % (started, n, timeout,
                                                            sc.defaultParallelism))
            collector.join()
        if "error" in outcome:
            raise _failure(outcome["error"], server, n) from outcome["error"]
    finally:
        output.close()
        server.stop()
    results = dict(outcome["rows"])
    return [cloudpickle.loads(results[r]) for r in range(n)]


def _collect(rdd: Any, outcome: Dict[str, Any]) -> None:
    """Runs the barrier stage (in a thread of the driver)."""
    try:
        outcome["rows"] = rdd.collect()
    except Exception as e:  # noqa: BLE001 - the caller turns it into a WorkerError
        outcome["error"] = e


def _wait_started(server: RendezvousServer, scope: str, n: int, timeout: float,
                  collector: threading.Thread) -> int:
    """How many of the ``n`` tasks said they started before ``timeout``
    (or before the stage ended): a long-poll on the rendezvous store, woken by
    each task's key, at most once a second otherwise."""
    deadline = time.monotonic() + timeout
    for rank in range(n):
        while server.store.get(scope, str(rank), wait_s=0.0) is None:
            left = deadline - time.monotonic()
            if not collector.is_alive():
                return n  # the stage ended (done or failed): nothing left to wait for
            if left <= 0:
                return len(server.store.items(scope))
            server.store.get(scope, str(rank), wait_s=min(left, 1.0))
    return n


def check_executable(sc: Any, executable: Optional[str], what: str) -> None:
    """Warns when ``executable`` is not the Python Spark's workers run."""
    if executable is None:
        return
    worker = (sc.getConf().get("spark.pyspark.python", None)
              or os.environ.get("PYSPARK_PYTHON") or "python3")

    def where(cmd: str) -> str:
        return os.path.abspath(shutil.which(cmd) or cmd)

    if where(executable) != where(worker):
        warnings.warn("tfhvd.spark.%s(executable=%r): Spark's Python workers run %r "
                      "(spark.pyspark.python or PYSPARK_PYTHON), and the ranks run in them; "
                      "set PYSPARK_PYTHON to choose their Python" % (what, executable, worker),
                      stacklevel=3)


def _failure(e: Exception, server: RendezvousServer, n: int) -> WorkerError:
    text = str(e)
    reported = {int(k): v.decode(errors="replace")
                for k, v in server.store.items(_ERROR_SCOPE).items()}
    m = re.search(r"ResultTask\(\d+, (\d+)\)", text) or \
        re.search(r"Lost task (\d+)\.\d+ in stage", text)
    rank = int(m.group(1)) if m else (min(reported) if reported else -1)
    # The rank Spark saw fail first may only have lost its peer (a Gloo read
    # error, or the runtime naming the rank that left).  Then the cause is a
    # rank that raised something else, or else one whose process died: it
    # reported nothing.
    if rank in reported and _peer_loss(reported[rank]):
        genuine = [r for r, tb in sorted(reported.items()) if not _peer_loss(tb)]
        if genuine:
            rank = genuine[0]
        else:
            lost = _lost_peer(reported[rank])
            silent = [r for r in range(n) if r not in reported]
            if lost is None or lost in reported or not 0 <= lost < n:
                lost = silent[0] if silent else None
            if lost is not None:
                return WorkerError("tfhvd.spark: the task of rank %d died without a Python "
                                   "exception (its process was lost); rank %d reported:\n%s"
                                   % (lost, rank, reported[rank]), lost)
    if rank in reported:
        tb = reported[rank]
        return WorkerError("tfhvd.spark: rank %d raised:\n%s" % (rank, tb), rank, tb)
    tb = _python_traceback(text)
    if tb:
        return WorkerError("tfhvd.spark: rank %s failed in its Spark task:\n%s"
                           % (rank if rank >= 0 else "?", tb), rank, tb)
    reason = _spark_reason(text)
    return WorkerError("tfhvd.spark: the task of rank %s failed without a Python exception "
                       "(its process died?): %s; every task of the job was stopped"
                       % (rank if rank >= 0 else "?", reason), rank)


_PEER_LOSS = re.compile(r"have exited or lost their connection|Connection reset by peer|"
                        r"Connection closed by peer|Broken pipe|Connection refused|"
                        r"lost (?:its|the) connection")


def _peer_loss(text: str) -> bool:
    """Whether a rank's traceback is the symptom of another rank's loss."""
    return bool(_PEER_LOSS.search(text))


def _lost_peer(text: str) -> Optional[int]:
    """The rank a tfhvd error says was lost (``ranks [1] have exited ...``)."""
    m = re.search(r"ranks \[(\d+)(?:, \d+)*\] have exited or lost their connection", text)
    return int(m.group(1)) if m else None


def _python_traceback(text: str) -> str:
    """The first Python traceback in Spark's error text, if any."""
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return ""
    lines = []
    for line in text[start:].splitlines():
        if line.lstrip().startswith("at ") or line.startswith("\tat "):
            break
        lines.append(line)
    return "\n".join(lines).strip() + "\n"


def _spark_reason(text: str) -> str:
    for line in text.splitlines():
        if "Exception" in line or "exited" in line or "killed" in line.lower():
            return line.strip()[:500]
    return text.splitlines()[0][:500] if text else "unknown"
