"""Gloo against MPI, side by side on one host: allreduce time and Keras throughput.

    python examples/backend_benchmark.py -np 2 --rounds 3

A process runs one backend, so the comparison is made of jobs: each round
runs the same worker once under ``tfhvdrun --mpi`` (mpirun, MPI backend) and once
under ``tfhvdrun --gloo`` (Gloo backend), in alternating order (MPI first, then
Gloo first, ...), so both see the same machine drift.  Per round it takes
the ratio Gloo/MPI of each figure and reports the median over rounds:

* eager ``hvd.allreduce`` (float32, op=Sum) from 4 KiB to 64 MiB, median of
  ``--reps`` calls, slowest rank (target: Gloo within 2x of MPI from 1 MiB);
* Keras ``model.fit`` throughput of ``keras_synthetic_benchmark.py --model
  cnn`` (target: Gloo >= 0.9 of MPI).

``--worker allreduce`` is the job each launcher runs; it prints one
``BENCH {json}`` line on rank 0.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=2, help="ranks per job")
    p.add_argument("--rounds", type=int, default=3, help="pairs of jobs (MPI, Gloo)")
    p.add_argument("--reps", type=int, default=30, help="timed allreduces per size")
    p.add_argument("--keras-iters", type=int, default=5, help="timed Keras epochs per job")
    p.add_argument("--skip-keras", action="store_true")
    p.add_argument("--worker", choices=["allreduce"], help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker_allreduce(reps: int) -> None:
    """One job's allreduce timings (run by a launcher)."""
    import numpy as np
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    import tensorflow as tf
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    out: Dict[str, float] = {}
    for n in SIZES:
        x = tf.constant(np.ones(n // 4, np.float32))
        count = max(5, reps if n <= (4 << 20) else reps // 3)
        for _ in range(3):
            hvd.allreduce(x, op=hvd.Sum)
        times: List[float] = []
        for _ in range(count):
            hvd.barrier()
            t0 = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum)
            times.append(time.perf_counter() - t0)
        med = float(hvd.allreduce(tf.constant(statistics.median(times)), op=hvd.Max).numpy())
        out[str(n)] = med
    if hvd.rank() == 0:
        print("BENCH " + json.dumps({"backend": "gloo" if hvd.gloo_enabled() else "mpi",
                                     "allreduce": out}), flush=True)


def launcher(backend: str, np_: int) -> List[str]:
    """Both jobs start as a user starts them: ``tfhvdrun --mpi`` (mpirun with
    tfhvdrun's defaults) and ``tfhvdrun --gloo``."""
    return [sys.executable, "-m", "tfhvd.runner", "--" + backend, "-np", str(np_)]


def run_job(cmd: List[str]) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit("job failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stderr[-3000:]))
    return r.stdout


def _text(line: str) -> str:
    return line.split(">:", 1)[1] if line.startswith("[") and ">:" in line else line


def allreduce_job(backend: str, args: argparse.Namespace) -> Dict[str, float]:
    out = run_job(launcher(backend, args.np) + [sys.executable, os.path.abspath(__file__),
                                                "--worker", "allreduce",
                                                "--reps", str(args.reps)])
    for line in out.splitlines():
        if _text(line).startswith("BENCH "):
            data = json.loads(_text(line)[6:])
            assert data["backend"] == backend, data
            return data["allreduce"]
    sys.exit("no BENCH line from the %s job:\n%s" % (backend, out[-2000:]))


def keras_job(backend: str, args: argparse.Namespace) -> float:
    out = run_job(launcher(backend, args.np) + [
        sys.executable, os.path.join(HERE, "keras_synthetic_benchmark.py"), "--model", "cnn",
        "--num-iters", str(args.keras_iters)])
    for line in out.splitlines():
        t = _text(line).strip()
        if "total:" in t and "img/sec" in t:
            return float(t.split("total:")[1].split()[0])
    sys.exit("no throughput line from the %s Keras job:\n%s" % (backend, out[-2000:]))


def human(n: int) -> str:
    return "%d KiB" % (n // 1024) if n < 1 << 20 else "%d MiB" % (n >> 20)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker == "allreduce":
        worker_allreduce(args.reps)
        return 0
    order = [("mpi", "gloo") if i % 2 == 0 else ("gloo", "mpi") for i in range(args.rounds)]
    times: Dict[str, List[Dict[str, float]]] = {"mpi": [], "gloo": []}
    for pair in order:
        for b in pair:
            times[b].append(allreduce_job(b, args))
    print("## Allreduce, Gloo vs MPI backend (float32, op=Sum, eager), %d ranks, %d rounds"
          % (args.np, args.rounds))
    print("| size | MPI (us) | Gloo (us) | Gloo/MPI (median of rounds) |")
    print("|---:|---:|---:|---:|")
    worst = 0.0
    for n in SIZES:
        k = str(n)
        mpi = statistics.median(t[k] for t in times["mpi"])
        gloo = statistics.median(t[k] for t in times["gloo"])
        ratio = statistics.median(g[k] / m[k] for g, m in zip(times["gloo"], times["mpi"]))
        if n >= 1 << 20:
            worst = max(worst, ratio)
        print("| %s | %.0f | %.0f | %.2f |" % (human(n), mpi * 1e6, gloo * 1e6, ratio))
    print("Worst Gloo/MPI ratio from 1 MiB: %.2f   (target <= 2.0)" % worst)
    sys.stdout.flush()
    if args.skip_keras:
        return 0
    thr: Dict[str, List[float]] = {"mpi": [], "gloo": []}
    for pair in order:
        for b in pair:
            thr[b].append(keras_job(b, args))
    ratios = [g / m for g, m in zip(thr["gloo"], thr["mpi"])]
    print("\n## Keras model.fit (keras_synthetic_benchmark.py --model cnn), %d ranks" % args.np)
    print("| round | MPI img/sec | Gloo img/sec | Gloo/MPI |")
    print("|---:|---:|---:|---:|")
    for i, (m, g) in enumerate(zip(thr["mpi"], thr["gloo"])):
        print("| %d | %.1f | %.1f | %.3f |" % (i + 1, m, g, g / m))
    print("Median throughput ratio Gloo/MPI: %.3f   (target >= 0.9)" % statistics.median(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
