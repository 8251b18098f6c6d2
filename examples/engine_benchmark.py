"""Start-up time and Keras ``fit`` throughput of the same 2-rank job under
``tfhvdrun --gloo``, ``tfhvd.ray.RayExecutor`` and ``tfhvd.spark.run``.

    python examples/engine_benchmark.py [--np 2] [--epochs 30] [--repeats 9]

Each launcher runs :func:`train` (an MLP on scikit-learn's 8x8 digits, every
rank its own shard, one TensorFlow thread per rank) once per repeat; the order
of the three rotates from repeat to repeat, so none always runs first:

* start-up: from the launch (the engine already running: Ray's ``ray.init``
  and Spark's context are set up before the clock starts, as on a cluster
  that is up) to the moment every rank has finished ``hvd.init()``;
* throughput: samples per second of all ranks over the epochs after the
  first (which builds the graph), and its ratio to the ``tfhvdrun`` run of
  the same repeat (median and range of those per-repeat ratios);
* where the machine's time went during the timed epochs (Linux only): the
  ranks' own CPU per 1,000 samples, the CPU every other process used, and
  the time the hypervisor took from this machine (steal), from
  ``/proc/stat`` and the ranks' process times;
* the final weights, so the table also says whether they equal tfhvdrun's.

The interleaved run (``--rounds``) also runs the Ray and Spark jobs with
``TFHVD_ENGINE_SESSION=inherit``: their ranks then stay in the engine's
session, and so in its scheduling group where the kernel's autogroup is on,
which shows what a session of their own (the default) is worth.

Under tfhvdrun this file is also the worker program (``--worker``).
"""

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np


def _machine_times() -> Optional[List[float]]:
    """The machine's busy and steal seconds since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal ...
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
    return [busy / hz, fields[7] / hz]


def _thread_times() -> Dict[str, float]:
    """This process's CPU seconds by thread, keyed ``name/tid`` (Linux); the
    main thread is ``main`` (Ray renames it), TensorFlow's ``tf_*``."""
    hz, out, pid = os.sysconf("SC_CLK_TCK"), {}, str(os.getpid())
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                text = f.read()
        except OSError:
            continue  # a thread that just ended
        name = "main" if tid == pid else text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out["%s/%s" % (name, tid)] = (int(fields[11]) + int(fields[12])) / hz
    return out


class _TurnClient:
    """A rank's side of the interleaved run: blocks (in ``recv``, no polling)
    until its job's turn, and reports when its window of epochs ends."""

    def __init__(self, address: str, job: str, rank: int, samples: int) -> None:
        self.address, self.hello = address, {"job": job, "rank": rank, "samples": samples}
        self.sock: Optional[socket.socket] = None
        self.cpu0 = 0.0

    def connect(self) -> None:
        """Joins at the first turn, so no job's first (graph-building) epoch
        overlaps another's timed turns."""
        host, port = self.address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=600)
        self.f = self.sock.makefile("rw")
        self.send(self.hello)

    def send(self, msg: Dict) -> None:
        self.f.write(json.dumps(msg) + "\n")
        self.f.flush()

    def wait_turn(self) -> None:
        if self.sock is None:
            self.connect()
        if self.f.readline().strip() != "go":
            raise RuntimeError("engine_benchmark: the turn coordinator went away")
        self.cpu0 = time.process_time()

    def done(self) -> None:
        self.send({"cpu": time.process_time() - self.cpu0})


def train(epochs: int = 6, batch_size: int = 32, seed: int = 7,
          t0: float = 0.0, turns: Optional[str] = None, job: str = "",
          window: int = 1) -> Dict:
    """Trains the digits MLP on this rank's shard with tfhvd; returns the
    rank's timings and (rank 0) the final weights as lists.  With ``turns``
    (the coordinator's ``host:port``), every ``window`` epochs after the
    first wait for the job's turn (:func:`interleaved`)."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # a reused process (Spark's Python workers) keeps what it had
    import keras
    from sklearn.datasets import load_digits

    import tfhvd.keras as hvd

    hvd.init()
    import tensorflow as tf
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    ready = time.time()
    keras.utils.set_random_seed(seed)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    steps = len(x) // (hvd.size() * batch_size)
    x, y = x[hvd.rank()::hvd.size()][:steps * batch_size], \
        y[hvd.rank()::hvd.size()][:steps * batch_size]
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size()))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"])
    epoch_ends: List[float] = []
    marks: List[Dict] = []
    client = _TurnClient(turns, job, hvd.rank(), len(x)) if turns else None

    def on_epoch_begin(epoch: int, logs: Dict) -> None:
        if client and epoch >= 1 and (epoch - 1) % window == 0:
            client.wait_turn()

    def on_epoch_end(epoch: int, logs: Dict) -> None:
        if client and epoch >= 1 and epoch % window == 0:
            client.done()
        epoch_ends.append(time.time())
        if epoch in (0, epochs - 1):
            marks.append({"cpu": time.process_time(), "machine": _machine_times(),
                          "threads": _thread_times()})
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         keras.callbacks.LambdaCallback(on_epoch_begin=on_epoch_begin,
                                                             on_epoch_end=on_epoch_end)])
    if client and client.sock:
        client.sock.close()
    timed = len(epoch_ends) - 1
    out = {"rank": hvd.rank(), "size": hvd.size(), "ready": ready - t0 if t0 else None,
           "samples_per_s": (timed * len(x) / (epoch_ends[-1] - epoch_ends[0])
                             if timed > 0 else None),
           "samples": timed * len(x),
           "cpu_s": marks[-1]["cpu"] - marks[0]["cpu"] if timed > 0 else None,
           "machine": ([b - a for a, b in zip(marks[0]["machine"], marks[-1]["machine"])]
                       if timed > 0 and marks[0]["machine"] else None),
           "threads": _by_name(marks[0]["threads"], marks[-1]["threads"]) if timed > 0
           else {}}
    if hvd.rank() == 0:
        out["weights"] = [w.tolist() for w in model.get_weights()]
    return out


def _by_name(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """CPU seconds between two :func:`_thread_times`, summed by thread name."""
    out: Dict[str, float] = {}
    for key, t in after.items():
        name = key.rsplit("/", 1)[0]
        out[name] = out.get(name, 0.0) + t - before.get(key, 0.0)
    return out


def _summary(results: List[Dict]) -> Dict:
    """One run's figures from its ranks' results (sorted by rank)."""
    results = sorted(results, key=lambda r: r["rank"])
    out = {"startup_s": max(r["ready"] for r in results),
           "samples_per_s": sum(r["samples_per_s"] for r in results),
           "weights": results[0]["weights"], "threads": {}}
    samples = sum(r["samples"] for r in results)
    for r in results:
        for name, t in r.get("threads", {}).items():
            out["threads"][name] = out["threads"].get(name, 0.0) + 1e6 * t / samples
    if results[0].get("machine") and all(r.get("cpu_s") is not None for r in results):
        busy, steal = results[0]["machine"]
        ranks_cpu = sum(r["cpu_s"] for r in results)
        window = samples / out["samples_per_s"]  # the timed epochs' seconds
        out.update(cpu_ms_per_1k=1e6 * ranks_cpu / samples,
                   others_cores=max(busy - ranks_cpu, 0.0) / window,
                   steal_cores=steal / window)
    return out


def run_tfhvdrun(np_: int, epochs: int, **kw) -> Dict:
    """The job under ``tfhvdrun --gloo``; ``kw``: :func:`train`'s turn-taking."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        extra: List[str] = []
        for k, v in kw.items():
            extra += ["--" + k] if v is True else [] if v is False else ["--" + k, str(v)]
        subprocess.run([sys.executable, "-m", "tfhvd.runner", "--gloo", "-np", str(np_),
                        sys.executable, os.path.abspath(__file__), "--worker", "--out", d,
                        "--epochs", str(epochs), "--t0", repr(t0)] + extra, check=True,
                       stdout=subprocess.DEVNULL)
        results = []
        for r in range(np_):
            with open(os.path.join(d, "rank%d.json" % r)) as f:
                results.append(json.load(f))
    return _summary(results)


INHERIT = {"TFHVD_ENGINE_SESSION": "inherit"}


def run_ray(np_: int, epochs: int, env: Optional[Dict[str, str]] = None, **kw) -> Dict:
    """The job on ``tfhvd.ray.RayExecutor``; ``env``: more variables for its ranks."""
    from tfhvd.ray import RayExecutor

    t0 = time.time()
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=np_)
    ex.start(extra_env_vars=env)
    try:
        return _summary(ex.run(train, kwargs=dict(kw, epochs=epochs, t0=t0)))
    finally:
        ex.shutdown()


def run_spark(np_: int, epochs: int, env: Optional[Dict[str, str]] = None, **kw) -> Dict:
    """The job on ``tfhvd.spark.run``; ``env``: more variables for its ranks."""
    import tfhvd.spark

    t0 = time.time()
    return _summary(tfhvd.spark.run(train, kwargs=dict(kw, epochs=epochs, t0=t0),
                                    num_proc=np_, env=env))


class _Coordinator:
    """Gives the jobs' turns round-robin (the order rotating each round) and
    times each turn: from its "go" to the last rank's report."""

    def __init__(self, jobs: List[str], np_: int, rounds: int) -> None:
        self.jobs, self.np, self.rounds = jobs, np_, rounds
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(600)
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.turns: Dict[str, List[Dict]] = {j: [] for j in jobs}

    @staticmethod
    def _report(f, job: str) -> Dict:
        line = f.readline()
        if not line:
            raise OSError("a rank of %r hung up mid-turn" % job)
        return json.loads(line)

    def stop(self) -> None:
        """Wakes :meth:`run` out of ``accept`` (a job failed to start)."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.server.close()

    def run(self) -> None:
        ranks: Dict[str, List] = {j: [] for j in self.jobs}
        samples: Dict[str, int] = {j: 0 for j in self.jobs}
        try:
            while sum(map(len, ranks.values())) < len(self.jobs) * self.np:
                conn, _ = self.server.accept()
                conn.settimeout(600)
                f = conn.makefile("rw")
                hello = self._report(f, "a job")
                ranks[hello["job"]].append(f)
                samples[hello["job"]] += hello["samples"]
            for rnd in range(self.rounds):
                k = rnd % len(self.jobs)
                for job in self.jobs[k:] + self.jobs[:k]:
                    m0, start = _machine_times(), time.perf_counter()
                    for f in ranks[job]:
                        f.write("go\n")
                        f.flush()
                    cpu = sum(self._report(f, job)["cpu"] for f in ranks[job])
                    wall, m1 = time.perf_counter() - start, _machine_times()
                    turn = {"wall": wall, "cpu": cpu, "samples": samples[job]}
                    if m0 and m1:
                        turn.update(busy=m1[0] - m0[0], steal=m1[1] - m0[1])
                    self.turns[job].append(turn)
        finally:
            for fs in ranks.values():
                for f in fs:
                    f.close()
            self.server.close()


def interleaved(launchers: List, np_: int, rounds: int, window: int,
                **kw) -> Dict[str, Dict]:
    """All three jobs alive at once, taking turns of ``window`` epochs, so the
    machine's drift hits them alike; returns each job's turns (its
    ``samples`` per epoch times ``window``) and final weights; ``kw``: more
    of :func:`train`'s keywords."""
    coord = _Coordinator([name for name, _ in launchers], np_, rounds)
    finals: Dict[str, Dict] = {}
    errors: List[BaseException] = []

    def job(name: str, launch: Callable) -> None:
        try:
            finals[name] = launch(np_, 1 + rounds * window, turns=coord.address, job=name,
                                  window=window, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            coord.stop()
    threads = [threading.Thread(target=job, args=l, daemon=True) for l in launchers]
    for t in threads:
        t.start()
    try:
        coord.run()
    except OSError:
        if not errors:
            raise
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for name, turns in coord.turns.items():
        for turn in turns:
            turn["samples"] *= window
        finals[name]["turns"] = turns
    return {name: finals[name] for name in coord.turns}  # in the launchers' order


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--rounds", type=int, default=40,
                   help="turns of each job in the interleaved run (0: none)")
    p.add_argument("--window", type=int, default=4, help="epochs per turn")
    p.add_argument("--no-inherit", action="store_true",
                   help="leave the TFHVD_ENGINE_SESSION=inherit jobs out of the interleaved run")
    p.add_argument("--dump", help="also write every run's and turn's figures to this JSON file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--turns", help=argparse.SUPPRESS)
    p.add_argument("--job", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        res = train(args.epochs, t0=args.t0, turns=args.turns, job=args.job,
                    window=args.window)
        with open(os.path.join(args.out, "rank%d.json" % res["rank"]), "w") as f:
            json.dump(res, f)
        return

    import pyspark.cloudpickle
    import ray
    import ray.cloudpickle
    from pyspark.sql import SparkSession

    import tfhvd.ray  # noqa: F401 - imported once here, not by the job threads at once
    import tfhvd.spark  # noqa: F401

    # The engines' workers cannot import examples/: send this file by value.
    for pickler in (ray.cloudpickle, pyspark.cloudpickle):
        pickler.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    launchers = [("tfhvdrun --gloo", run_tfhvdrun), ("RayExecutor", run_ray),
                 ("spark.run", run_spark)]
    mixes = launchers if args.no_inherit else launchers + [
        ("RayExecutor, inherited session", functools.partial(run_ray, env=INHERIT)),
        ("spark.run, inherited session", functools.partial(run_spark, env=INHERIT))]
    copies = 1 if args.no_inherit or not args.rounds else 2  # jobs alive at once per engine
    ray.init(num_cpus=args.np * 2 * copies, include_dashboard=False,
             object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    spark = SparkSession.builder.master("local-cluster[%d,1,1024]" % (args.np * copies)) \
        .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m") \
        .config("spark.python.worker.reuse", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows: Dict[str, List[Dict]] = {name: [] for name, _ in launchers}
    opts: Dict = {}
    mixed: Dict[str, Dict] = {}
    try:
        for rep in range(args.repeats):
            for k in range(len(launchers)):
                name, launch = launchers[(rep + k) % len(launchers)]
                rows[name].append(launch(args.np, args.epochs, **opts))
        if args.rounds:
            mixed = interleaved(mixes, args.np, args.rounds, args.window, **opts)
    finally:
        spark.stop()
        ray.shutdown()
    if args.dump:
        with open(args.dump, "w") as f:
            json.dump({"runs": rows, "interleaved": mixed}, f)
    if args.repeats:
        _print_table(rows, args)
    if mixed:
        _print_interleaved(mixed, args)


def _print_table(rows: Dict[str, List[Dict]], args: argparse.Namespace) -> None:
    """Medians over repeats; the ratio is the median (and range) of per-repeat ratios."""
    base = rows["tfhvdrun --gloo"]
    ref_w = base[0]["weights"]

    def med(rs: List[Dict], key: str, fmt: str) -> str:
        vals = [r[key] for r in rs if r.get(key) is not None]
        return fmt % float(np.median(vals)) if vals else "n/a"

    print("\n%d ranks, %d epochs, %d repeat(s), medians" % (args.np, args.epochs, args.repeats))
    print("| launcher | start-up (s) | fit samples/s | vs tfhvdrun (range) | ranks' CPU ms "
          "per 1k samples | other processes (cores) | steal (cores) | weights = tfhvdrun's |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in rows.items():
        ratios = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(rs, base)]
        same = all(np.allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
                   for run in rs for a, b in zip(run["weights"], ref_w))
        print("| %s | %s | %s | %.3f (%.2f-%.2f) | %s | %s | %s | %s |" % (
            name, med(rs, "startup_s", "%.2f"), med(rs, "samples_per_s", "%.0f"),
            float(np.median(ratios)), min(ratios), max(ratios),
            med(rs, "cpu_ms_per_1k", "%.1f"), med(rs, "others_cores", "%.2f"),
            med(rs, "steal_cores", "%.2f"), "yes" if same else "NO"))
    _print_threads(rows)


def _print_threads(rows: Dict[str, List[Dict]]) -> None:
    """The ranks' CPU ms per 1k samples by thread (medians over repeats)."""
    groups = ("main", "tf_Compute", "tfhvd_loop")
    print("\nranks' CPU ms per 1k samples by thread, medians")
    print("| launcher | %s | other threads (the largest) |" % " | ".join(groups))
    print("|---|%s---|" % ("---|" * len(groups)))
    for name, rs in rows.items():
        if not all(r.get("threads") for r in rs):
            continue
        names = set().union(*(r["threads"] for r in rs))
        med = {k: float(np.median([r["threads"].get(k, 0.0) for r in rs])) for k in names}
        rest = sorted(((v, k) for k, v in med.items() if k not in groups), reverse=True)
        print("| %s | %s | %.1f (%s) |" % (
            name, " | ".join("%.1f" % med.get(g, 0.0) for g in groups),
            sum(v for v, _ in rest), ", ".join("%s %.1f" % (k, v) for v, k in rest[:3])))


def _median_ci(values: List[float]) -> List[float]:
    """The median and its 95% bootstrap interval (2,000 resamples)."""
    v = np.asarray(values)
    idx = np.random.default_rng(0).integers(0, len(v), (2000, len(v)))
    lo, hi = np.percentile(np.median(v[idx], axis=1), [2.5, 97.5])
    return [float(np.median(v)), float(lo), float(hi)]


def _print_interleaved(finals: Dict[str, Dict], args: argparse.Namespace) -> None:
    """Per job, over its turns: the median rate and the fastest quarter's
    (the turns the machine's stalls spared); the ratio is per round, to the
    ``tfhvdrun`` turn of the same round, with the median's 95% interval."""
    base = finals["tfhvdrun --gloo"]

    def rate(t: Dict) -> float:
        return t["samples"] / t["wall"]
    print("\ninterleaved: %d ranks, %d rounds of %d epochs per job" % (
        args.np, args.rounds, args.window))
    print("| launcher | fit samples/s, median turn | vs tfhvdrun, median of rounds (95% "
          "interval) | fastest quarter's samples/s | vs tfhvdrun | ranks' CPU ms per 1k "
          "samples | other processes (cores) | steal (cores) | weights = tfhvdrun's |")
    print("|---|---|---|---|---|---|---|---|---|")
    fast_base = np.percentile([rate(t) for t in base["turns"]], 75)
    for name in sorted(finals, key=lambda n: n != "tfhvdrun --gloo"):
        fin = finals[name]
        turns = fin["turns"]
        rates = [rate(t) for t in turns]
        mid, lo, hi = _median_ci([r / rate(b) for r, b in zip(rates, base["turns"])])
        fast = np.percentile(rates, 75)
        others = [max(t["busy"] - t["cpu"], 0.0) / t["wall"] for t in turns if "busy" in t]
        steal = [t["steal"] / t["wall"] for t in turns if "steal" in t]
        same = all(np.allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
                   for a, b in zip(fin["weights"], base["weights"]))
        print("| %s | %.0f | %.3f (%.3f-%.3f) | %.0f | %.3f | %.1f | %s | %s | %s |" % (
            name, np.median(rates), mid, lo, hi, fast, fast / fast_base,
            np.median([1e6 * t["cpu"] / t["samples"] for t in turns]),
            "%.2f" % np.median(others) if others else "n/a",
            "%.2f" % np.median(steal) if steal else "n/a", "yes" if same else "NO"))


if __name__ == "__main__":
    main()
