#!/usr/bin/env python3
"""tfhvd across a network: hosts in network namespaces, links held to 1 or 10 Gbit/s.

    sudo .venv/bin/python scripts/network_benchmark.py                 # the full run
    sudo .venv/bin/python scripts/network_benchmark.py --quick --json out.json

Every figure in docs/PERFORMANCE.md's other sections comes from ranks on one
host over shared memory.  This script builds N hosts (scripts/netns_hosts.py:
one network namespace per host, all on one bridge, every link held to the rate
with a ``tbf`` qdisc in both directions, one sshd per host) and runs one rank per
host with ``tfhvdrun -H hostA:1,hostB:1,...`` from hostA, under MPI over TCP
(``--mpi``) and over Gloo (``--gloo``).  For each rate (``--rates``, Mbit/s) and
host count (``--hosts``) it measures, in the same processes and interleaved:

* allreduce (sum of float32) from 64 KiB to 256 MiB: raw mpi4py ``Allreduce``
  (MPI runs only), tfhvd eager ``hvd.allreduce``, and tfhvd's
  ``grouped_allreduce`` of 4 tensors inside one ``tf.function``.  Each figure is
  the bus bandwidth, algbw x 2(n-1)/n with algbw = bytes / time, divided by
  the link rate: 1.0 is a ring allreduce at the link's full rate.  Medians over
  ``--repeats``, each repeat timing every method once in a rotated order, the
  slowest rank's time.
* Keras ``fit`` throughput, samples/s per rank, of the synthetic benchmark's
  CNN (examples/keras_synthetic_benchmark.py's model, on synthetic images
  whose class is learnable) and a small MLP (examples/async_benchmark.py's),
  for no exchange at all (``none``: each rank alone on its shard: the one-host
  speed), synchronous ``DistributedOptimizer``, ``staleness=1`` with
  ``DelayedGradientsCallback``, and ``LocalSGD`` k=2, 4, 8, with the final
  validation accuracy (examples/async_benchmark.py's ``run``).  Scaling
  efficiency = samples/s per rank / the same repeat's ``none``.

The tables print as each (rate, hosts, backend) finishes; ``--json FILE``
writes every raw figure (scripts/scaling_model.py calibrates from it).  Needs
root (namespaces); refuses with the reason otherwise.  The hosts share this
machine's CPUs: with 2 cores, 3 hosts' compute contends, which the ``none``
baseline (run the same way, at the same time) accounts for.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from netns_hosts import (IFNAME, NetnsHosts, remove_stale, tcp_rate_mbit,  # noqa: E402
                         unavailable_reason)

KIB, MIB = 1024, 1024 * 1024
FULL_SIZES = [64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
QUICK_SIZES = [64 * KIB, MIB, 16 * MIB, 64 * MIB]
MODES = ["none", "sync", "stale1", "local2", "local4", "local8"]
METHODS = ["mpi4py", "eager", "grouped", "horovod eager", "horovod grouped"]
HOROVOD_PYTHON = "/tmp/hvd028/venv/bin/python"  # where the docs' attempt installed it


# ===================================================================== worker
# Runs on every host (one rank each) under tfhvdrun.

def _worker(args) -> None:
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    comm = None
    if args.backend.startswith("mpi"):
        from mpi4py import MPI  # initialises MPI (THREAD_MULTIPLE); tfhvd reuses it
        comm = MPI.COMM_WORLD
    import tfhvd.keras as hvd
    import tfhvd.tensorflow as hvdtf
    hvd.init()
    out: Dict[str, object] = {"size": hvd.size(), "backend": args.backend, "allreduce": [],
                              "fit": []}

    def slowest(value: float) -> float:
        return max(hvdtf.allgather_object(value, name="bench_max"))

    if args.sizes:
        methods = [m for m in METHODS[:3] if comm is not None or m != "mpi4py"]
        for size in [int(s) for s in args.sizes.split(",")]:
            n = size // 4
            arr = np.ones(n, np.float32)
            dst = np.empty_like(arr)
            t = tf.ones([n], tf.float32)
            parts = [tf.ones([n // 4], tf.float32) for _ in range(4)]

            @tf.function
            def grouped(ps):
                return hvdtf.grouped_allreduce(ps, op=hvdtf.Sum)

            calls = {
                "mpi4py": lambda: comm.Allreduce(arr, dst, op=MPI.SUM),
                "eager": lambda: hvdtf.allreduce(t, op=hvdtf.Sum).numpy(),
                "grouped": lambda: [p.numpy() for p in grouped(parts)],
            }
            out["allreduce"] += _time_sizes(size, {m: calls[m] for m in methods},
                                            args.repeats, hvdtf.barrier, slowest)
            del arr, dst, t, parts

    if args.tasks:
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        import async_benchmark as ab
        makers = {"mlp": lambda r, n: ab.mlp_task(r, n),
                  "cnn": lambda r, n: _cnn_task(r, n, args)}
        tasks = [makers[x](hvd.rank(), hvd.size()) for x in args.tasks.split(",")]
        for task in tasks:
            if args.mlp_epochs and task["name"].startswith("MLP"):
                task["epochs"] = args.mlp_epochs
        modes = args.modes.split(",")
        for task in tasks:
            res = {m: [] for m in modes}
            for rep in range(args.fit_repeats):
                k = rep % len(modes)
                for m in modes[k:] + modes[:k]:
                    thr, acc = ab.run(task, m)
                    rates = hvdtf.allgather_object(thr, name="bench_rate")
                    res[m].append((min(rates), acc))  # the slowest rank's rate
            probe = task["build"]()
            weights = _digest(ab, task) if args.digest else None
            out["fit"].append({
                "task": task["name"], "batch": task["batch"], "epochs": task["epochs"],
                "params": int(probe.count_params()), "tensors": len(probe.trainable_weights),
                "modes": {m: {"samples_per_s": [r[0] for r in res[m]],
                              "val_accuracy": [r[1] for r in res[m]]} for m in modes},
                "digest": weights})
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)


def _time_sizes(size: int, calls, repeats: int, barrier, slowest) -> List[dict]:
    """Each call timed ``repeats`` times in a rotated order, after a barrier;
    per repeat the slowest rank's mean time of ``iters`` calls."""
    methods = list(calls)
    iters = max(1, min(20, int(4 * MIB / size)))
    for m in methods:  # warm up (traces the function, opens connections)
        calls[m]()
    times: Dict[str, List[float]] = {m: [] for m in methods}
    for rep in range(repeats):
        k = rep % len(methods)
        for m in methods[k:] + methods[:k]:
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                calls[m]()
            times[m].append(slowest((time.perf_counter() - t0) / iters))
    return [{"method": m, "bytes": size, "seconds": times[m], "iters": iters} for m in methods]


def _horovod_worker(args) -> None:
    """The same allreduce loop with Horovod itself (its own venv and TensorFlow)."""
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    import horovod
    out: Dict[str, object] = {"size": hvd.size(), "backend": "horovod", "allreduce": [],
                              "fit": [], "horovod": horovod.__version__, "tensorflow":
                              tf.__version__}

    def slowest(value: float) -> float:
        return max(hvd.allgather_object(value, name="bench_max"))

    zero = tf.zeros([1])

    def barrier() -> None:  # horovod.tensorflow has none: a one-float allreduce
        hvd.allreduce(zero, op=hvd.Sum, name="bench_barrier").numpy()

    for size in [int(s) for s in args.sizes.split(",")]:
        n = size // 4
        t = tf.ones([n], tf.float32)
        parts = [tf.ones([n // 4], tf.float32) for _ in range(4)]

        @tf.function
        def grouped(ps):
            return hvd.grouped_allreduce(ps, op=hvd.Sum)

        calls = {"horovod eager": lambda: hvd.allreduce(t, op=hvd.Sum).numpy(),
                 "horovod grouped": lambda: [p.numpy() for p in grouped(parts)]}
        out["allreduce"] += _time_sizes(size, calls, args.repeats, barrier, slowest)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)


def _digest(ab, task) -> Dict[str, object]:
    """Synchronous training of ``task`` once more; a checksum of the final weights
    (the test compares it with the same job on one host)."""
    import hashlib

    import keras
    import numpy as np

    import tfhvd.keras as hvd
    keras.utils.set_random_seed(1234)
    model = task["build"]()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(task["lr"]))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=False)
    model.fit(task["x"], task["y"], batch_size=task["batch"], epochs=task["epochs"],
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(np.ascontiguousarray(w).tobytes())
    import tfhvd.tensorflow as hvdtf
    ranks = hvdtf.allgather_object(h.hexdigest(), name="bench_digest")
    return {"sha256": ranks[0], "ranks_agree": len(set(ranks)) == 1}


def _cnn_task(rank: int, size: int, args):
    """examples/keras_synthetic_benchmark.py's CNN (32x32x3 images, 10 classes) on
    synthetic images that carry their class: a fixed random pattern per class
    plus noise, so the validation accuracy means something."""
    import keras
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from keras_synthetic_benchmark import build_model
    rng = np.random.default_rng(11)
    patterns = rng.normal(size=(10, 32, 32, 3)).astype("float32")
    total = args.cnn_samples + 1024
    y_all = rng.integers(0, 10, size=total)
    x_all = (0.5 * patterns[y_all] + rng.normal(size=(total, 32, 32, 3))).astype("float32")
    x_train, y_train = x_all[:args.cnn_samples], y_all[:args.cnn_samples]
    batch = 32
    steps = len(x_train) // (size * batch)
    x, y = x_train[rank::size][:steps * batch], y_train[rank::size][:steps * batch]

    def build():
        # The benchmark's model ends in logits; the shared `run` uses probabilities.
        return keras.Sequential([build_model(keras, "cnn", 32), keras.layers.Softmax()])

    return dict(name="synthetic-benchmark CNN", x=x, y=y, x_test=x_all[args.cnn_samples:],
                y_test=y_all[args.cnn_samples:], batch=batch, lr=0.001 * size,
                epochs=args.epochs, build=build)


# ===================================================================== driver

def busbw_fraction(nbytes: int, seconds: float, n: int, rate_mbit: float) -> float:
    """Bus bandwidth (algbw x 2(n-1)/n) over the link rate."""
    return nbytes / seconds * 2 * (n - 1) / n * 8 / (rate_mbit * 1e6)


def run_job(hosts: NetnsHosts, backend: str, worker_args: List[str], timeout: float,
            python: str = sys.executable) -> Dict[str, object]:
    """One rank per host, launched from hostA; the rank-0 result file."""
    fd, out = tempfile.mkstemp(prefix="tfhvd-netbench-", suffix=".json")
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))}
    env.update({"OMPI_MCA_plm_rsh_agent": "ssh -F %s" % hosts.ssh_config,
                "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    if backend == "mpiring":  # Open MPI's ring allreduce, chosen for every size
        env.update({"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                    "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"})
    launcher = os.path.join(os.path.dirname(sys.executable), "tfhvdrun")
    launcher = [launcher] if os.path.exists(launcher) else [sys.executable, "-m",
                                                            "tfhvd.runner"]
    cmd = hosts.in_host(hosts.names[0], launcher + [
        "--gloo" if backend == "gloo" else "--mpi", "-np", str(len(hosts.names)),
        "-H", hosts.hosts_arg(1),
        "-p", str(hosts.port), "-i", hosts.key, "--network-interface", IFNAME,
        "--start-timeout", "30", python, os.path.abspath(__file__), "--worker",
        "--backend", backend, "--out", out] + worker_args)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=ROOT)
        if r.returncode != 0:
            raise RuntimeError("the %s job failed (exit %d):\n%s" % (
                backend, r.returncode, "\n".join((r.stdout + r.stderr).splitlines()[-40:])))
        with open(out) as f:
            return json.load(f)
    finally:
        os.unlink(out)


def print_allreduce(res: Dict[str, object], rate: float, n: int) -> None:
    rows = res["allreduce"]
    if not rows:
        return
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    print("\n%s, %d hosts, %g Gbit/s: allreduce bus bandwidth / link rate (median of %d)"
          % (res["backend"], n, rate / 1000, len(rows[0]["seconds"])))
    print("| size | " + " | ".join(methods) + " | " +
          " | ".join("%s ms" % m for m in methods) + " |")
    print("|---:|" + "---:|" * (2 * len(methods)))
    for size in sorted({r["bytes"] for r in rows}):
        med = {r["method"]: statistics.median(r["seconds"]) for r in rows if r["bytes"] == size}
        print("| %s | %s | %s |" % (
            _size(size), " | ".join("%.2f" % busbw_fraction(size, med[m], n, rate)
                                    for m in methods),
            " | ".join("%.2f" % (med[m] * 1e3) for m in methods)))


def fit_summary(entry: Dict[str, object]) -> Dict[str, Dict[str, float]]:
    """Per mode: median samples/s, median ratio to the same repeat's none, accuracy."""
    modes = entry["modes"]
    base = modes["none"]["samples_per_s"]
    out = {}
    for m, v in modes.items():
        ratios = [a / b for a, b in zip(v["samples_per_s"], base)]
        out[m] = {"samples_per_s": statistics.median(v["samples_per_s"]),
                  "efficiency": statistics.median(ratios),
                  "val_accuracy": statistics.median(v["val_accuracy"]),
                  "step_s": entry["batch"] / statistics.median(v["samples_per_s"])}
    return out


def print_fit(res: Dict[str, object], rate: float, n: int) -> None:
    for entry in res["fit"]:
        s = fit_summary(entry)
        sync_lost = s["none"]["step_s"] and (s["sync"]["step_s"] - s["none"]["step_s"]) if (
            "sync" in s) else None
        print("\n%s, %d hosts, %g Gbit/s: %s (%d params, %d tensors, batch %d per rank; "
              "median of %d repeats)" % (res["backend"], n, rate / 1000, entry["task"],
                                         entry["params"], entry["tensors"], entry["batch"],
                                         len(entry["modes"]["none"]["samples_per_s"])))
        print("| mode | samples/s per rank | vs none | step ms | val. accuracy | "
              "vs sync (points) | of sync's loss recovered |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for m, v in s.items():
            recovered = ""
            if sync_lost and sync_lost > 0 and m not in ("none", "sync"):
                recovered = "%.0f%%" % (100 * (s["sync"]["step_s"] - v["step_s"]) / sync_lost)
            print("| %s | %.0f | %.2f | %.2f | %.4f | %s | %s |" % (
                m, v["samples_per_s"], v["efficiency"], 1e3 * v["step_s"], v["val_accuracy"],
                "%+.1f" % (100 * (v["val_accuracy"] - s["sync"]["val_accuracy"]))
                if "sync" in s else "", recovered))


def _size(n: int) -> str:
    return "%d MiB" % (n // MIB) if n >= MIB else "%d KiB" % (n // KIB)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1000,10000",
                   help="link rates in Mbit/s, comma-separated (default 1000,10000)")
    p.add_argument("--hosts", default="2,3", help="host counts, comma-separated (default 2,3)")
    p.add_argument("--backends", default="mpi,gloo",
                   help="mpi, gloo, mpiring (MPI with Open MPI's ring allreduce forced), "
                        "comma-separated (default mpi,gloo)")
    p.add_argument("--sizes", default=None,
                   help="allreduce sizes in bytes, comma-separated (default 64 KiB..256 MiB; "
                        "'' for none)")
    p.add_argument("--horovod-python", default=None,
                   help="a Python with horovod installed: also time Horovod's allreduce "
                        "(under MPI); default %s when it exists" % HOROVOD_PYTHON)
    p.add_argument("--no-horovod", action="store_true", help="skip Horovod even if found")
    p.add_argument("--repeats", type=int, default=5, help="allreduce repeats (median)")
    p.add_argument("--tasks", default="cnn,mlp", help="fit tasks: cnn, mlp ('' for none)")
    p.add_argument("--modes", default=",".join(MODES), help="fit modes (none must be one)")
    p.add_argument("--fit-repeats", type=int, default=3, help="fit repeats (median)")
    p.add_argument("--fit-backends", default="mpi",
                   help="backends that run the fit part (default mpi)")
    p.add_argument("--epochs", type=int, default=4, help="CNN epochs (the MLP's are fixed)")
    p.add_argument("--mlp-epochs", type=int, default=0,
                   help="MLP epochs (0: examples/async_benchmark.py's 6)")
    p.add_argument("--cnn-samples", type=int, default=6144, help="CNN training images")
    p.add_argument("--threads", type=int, default=1, help="TensorFlow threads per rank")
    p.add_argument("--digest", action="store_true",
                   help="also train synchronously once more and record a weight checksum")
    p.add_argument("--quick", action="store_true",
                   help="one rate (the first), 2 hosts, 4 sizes, 3 repeats, the MLP, 1 fit "
                        "repeat")
    p.add_argument("--json", default=None, help="write every raw figure to this file")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per job")
    # Worker side (set by the driver).
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="mpi", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        (_horovod_worker if args.backend == "horovod" else _worker)(args)
        return 0
    sizes = args.sizes if args.sizes is not None else ",".join(
        str(s) for s in (QUICK_SIZES if args.quick else FULL_SIZES))
    rates = [float(r) for r in args.rates.split(",")]
    counts = [int(h) for h in args.hosts.split(",")]
    if args.quick:
        rates, counts = rates[:1], counts[:1]
        args.repeats, args.fit_repeats = min(args.repeats, 3), 1
        if args.tasks == "cnn,mlp":
            args.tasks = "mlp"
    hpy = args.horovod_python or (HOROVOD_PYTHON if os.path.exists(HOROVOD_PYTHON) else None)
    backends = args.backends.split(",") + (["horovod"] if hpy and not args.no_horovod else [])
    why = unavailable_reason(rate_mbit=min(rates))
    if why:
        print("network_benchmark: cannot build namespaced hosts: " + why, file=sys.stderr)
        return 2
    remove_stale()
    record = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "argv": sys.argv[1:],
              "machine": {"cpus": os.cpu_count()}, "runs": []}
    start = time.monotonic()
    for rate in rates:
        for n in counts:
            with NetnsHosts(n, rate_mbit=rate) as hosts:
                tcp = tcp_rate_mbit(hosts, hosts.names[0], hosts.names[1])
                print("\n== %d hosts, links at %g Gbit/s: one TCP stream hostA -> hostB "
                      "%.0f Mbit/s" % (n, rate / 1000, tcp))
                for backend in backends:
                    fit = backend in args.fit_backends.split(",")
                    wargs = ["--sizes", sizes, "--repeats", str(args.repeats),
                             "--tasks", args.tasks if fit else "", "--modes", args.modes,
                             "--fit-repeats", str(args.fit_repeats), "--epochs",
                             str(args.epochs), "--mlp-epochs", str(args.mlp_epochs),
                             "--cnn-samples", str(args.cnn_samples),
                             "--threads", str(args.threads)] + (
                                 ["--digest"] if args.digest else [])
                    t0 = time.monotonic()
                    load0 = os.getloadavg()[0]
                    if backend == "horovod":
                        wargs = ["--sizes", sizes, "--repeats", str(args.repeats)]
                    try:
                        res = run_job(hosts, backend, wargs, args.timeout,
                                      hpy if backend == "horovod" else sys.executable)
                    except RuntimeError as e:
                        if backend != "horovod":
                            raise
                        print("Horovod's job failed; going on without it:\n%s" % e)
                        continue
                    res.update(rate_mbit=rate, hosts=n, seconds=time.monotonic() - t0,
                               tcp_stream_mbit=tcp,
                               loadavg_1min=[load0, os.getloadavg()[0]])
                    record["runs"].append(res)
                    print_allreduce(res, rate, n)
                    print_fit(res, rate, n)
                    sys.stdout.flush()
                    if args.json:  # after every job, so a stopped run keeps what it had
                        with open(args.json, "w") as f:
                            json.dump(record, f, indent=1)
    print("\n(%.0f s in all)" % (time.monotonic() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
