"""Allreduce benchmark: tfhvd against raw mpi4py, interleaved in the same processes.

    mpirun -np 2 python examples/allreduce_benchmark.py

For each size it alternates one tfhvd allreduce (eager, op=Sum) with one
mpi4py ``Allreduce`` of a numpy array of the same size, so both see the same
machine noise, and reports the medians, their ratio raw/tfhvd (1.0 = no
overhead), and the median of the per-pair ratios (each tfhvd call against the
raw call right after it, which cancels slow drifts of a shared machine).  It also times many small tensors in one ``tf.function`` against
one tensor of their total size, and a raw mpi4py Allreduce while tfhvd is
initialised but idle against the same call with tfhvd shut down.

``--eager-breakdown`` splits one eager allreduce into its parts, four calls
interleaved in the same processes: ``hvd.allreduce``; the library's op called
directly (no tfhvd Python); the library's reference op ``TfhvdAsyncIdentity``
called the same way (HorovodAllreduce's attrs, asynchronous, returns its input
at once: TensorFlow's own cost of dispatching that op eagerly, which TensorFlow
2.21 always runs as a one-op function); and mpi4py's ``Allreduce``.  Each repeat
runs the four in a shuffled order (the same on every rank), so each follows
mpi4py's call (which streams the tensor through the caches) about equally often.  The last row is the
ceiling of raw/tfhvd at that size, transport / (transport + dispatch): the ratio a
runtime that cost nothing would show.  ``--breakdown-kib N`` sets the size (1 KiB by default; 1024
for the 1 MiB row of issue 13).
"""

import argparse
import random
import statistics
import sys
import time
from typing import Callable, List, Tuple

from mpi4py import MPI  # initialises MPI (THREAD_MULTIPLE); tfhvd reuses it

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd

COMM = MPI.COMM_WORLD


def timed(fn: Callable[[], object]) -> float:
    COMM.Barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleave(a: Callable[[], object], b: Callable[[], object], reps: int
               ) -> Tuple[float, float, float]:
    """Medians (seconds) of a and b, alternated, and the median of the
    per-pair ratios b/a (each a timed right beside its b, so slow drifts of
    the machine cancel); both warmed up first."""
    for _ in range(3):
        a()
        b()
    ta: List[float] = []
    tb: List[float] = []
    for _ in range(reps):
        ta.append(timed(a))
        tb.append(timed(b))
    ratio = statistics.median(y / x for x, y in zip(ta, tb))
    # Every rank reports the slowest rank's medians and the worst ratio.
    return (COMM.allreduce(statistics.median(ta), op=MPI.MAX),
            COMM.allreduce(statistics.median(tb), op=MPI.MAX),
            COMM.allreduce(ratio, op=MPI.MIN))


def print_table(title: str, header: Tuple[str, ...], rows: List[Tuple[str, ...]]) -> None:
    """Prints a markdown table (rank 0 only), numbers right-aligned."""
    if hvd.rank() != 0:
        return
    print("\n## " + title)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    sys.stdout.flush()


def human(n: int) -> str:
    return "%d KiB" % (n // 1024) if n < 1 << 20 else "%d MiB" % (n >> 20)


def size_table(reps: int, max_bytes: int) -> None:
    if hvd.rank() == 0:
        print("\n## Single allreduce (float32, op=Sum), median of %d, slowest rank" % reps)
        print("| size | tfhvd (us) | mpi4py Allreduce (us) | raw/tfhvd | raw/tfhvd, paired |")
        print("|---:|---:|---:|---:|---:|")
    n = 1024
    while n <= max_bytes:
        count = n // 4
        x = tf.ones([count], tf.float32)
        src = np.ones(count, np.float32)
        dst = np.empty_like(src)
        r = max(5, reps if n <= (1 << 20) else reps // 4)
        t_hvd, t_raw, paired = interleave(lambda: hvd.allreduce(x, op=hvd.Sum, name="bench"),
                                  lambda: COMM.Allreduce(src, dst, op=MPI.SUM), r)
        if hvd.rank() == 0:
            print("| %s | %.1f | %.1f | %.2f | %.2f |" % (human(n), t_hvd * 1e6, t_raw * 1e6,
                                                        t_raw / t_hvd, paired), flush=True)
        n *= 4


def eager_breakdown(reps: int, kib: int = 1) -> None:
    """One eager allreduce of ``kib`` KiB, split into tfhvd's Python, TensorFlow's
    eager dispatch, tfhvd's runtime and the transport (medians of interleaved calls),
    and the ceiling of raw/tfhvd that TensorFlow's dispatch leaves at that size."""
    from tfhvd.tensorflow import mpi_ops

    op, reference = mpi_ops._ops().horovod_allreduce, mpi_ops._ops().tfhvd_async_identity
    x = tf.ones([kib * 256], tf.float32)
    src = np.ones(kib * 256, np.float32)
    dst = np.empty_like(src)
    calls = {
        "hvd.allreduce(x, op=hvd.Sum)": lambda: hvd.allreduce(x, op=hvd.Sum, name="bench"),
        "the library's op, called directly": lambda: op(
            x, reduce_op=hvd.Sum, prescale_factor=1.0, postscale_factor=1.0,
            ignore_name_scope=False, tensor_name="bench", process_set_id=0),
        "the reference op, called the same way": lambda: reference(
            x, reduce_op=hvd.Sum, prescale_factor=1.0, postscale_factor=1.0,
            ignore_name_scope=False, tensor_name="bench", process_set_id=0),
        "mpi4py Allreduce": lambda: COMM.Allreduce(src, dst, op=MPI.SUM),
    }
    for fn in calls.values():
        for _ in range(20):
            fn()
    times: dict = {k: [] for k in calls}
    order = list(calls.items())
    shuffle = random.Random(13).shuffle  # the same order on every rank
    for _ in range(reps):
        shuffle(order)
        for k, fn in order:
            times[k].append(timed(fn))
    med = {k: COMM.allreduce(statistics.median(v), op=MPI.MAX) for k, v in times.items()}
    hvd_t, op_t, tf_t, raw_t = (med[k] for k in calls)
    rows = [(k, "%.1f" % (v * 1e6)) for k, v in med.items()]
    rows += [("= tfhvd's Python (first - second)", "%.1f" % ((hvd_t - op_t) * 1e6)),
             ("= TensorFlow's eager dispatch (third)", "%.1f" % (tf_t * 1e6)),
             ("= tfhvd's runtime (second - third - fourth)",
              "%.1f" % ((op_t - tf_t - raw_t) * 1e6)),
             ("= the transport (fourth)", "%.1f" % (raw_t * 1e6)),
             ("raw/tfhvd measured: fourth / first", "%.2f" % (raw_t / hvd_t)),
             ("raw/tfhvd ceiling: fourth / (fourth + third)", "%.2f" % (raw_t / (raw_t + tf_t)))]
    print_table("One eager %s allreduce, broken down (median of %d interleaved calls, "
                "slowest rank)" % (human(kib * 1024), reps), ("call", "median (us)"), rows)


def many_small(reps: int) -> None:
    """64 tensors of 4 KiB made and reduced inside one tf.function (as gradients
    are inside a training step) against one 256 KiB tensor."""
    x = tf.ones([64 * 1024], tf.float32)  # 256 KiB

    @tf.function
    def many(t):
        parts = tf.split(t, 64)  # 64 x 4 KiB
        return tf.concat([hvd.allreduce(p, op=hvd.Sum, name="small_%d" % i)
                          for i, p in enumerate(parts)], 0)

    @tf.function
    def one(t):
        return hvd.allreduce(t, op=hvd.Sum, name="big")

    @tf.function
    def split_only(t):  # the same function without collectives
        return tf.concat([p * 1.0 for p in tf.split(t, 64)], 0)

    t_many, t_one, _ = interleave(lambda: many(x), lambda: one(x), reps)
    t_base, _, _ = interleave(lambda: split_only(x), lambda: None, reps)
    print_table("64 tensors of 4 KiB in one tf.function vs one 256 KiB tensor",
                ("case", "median (us)"),
                [("64 x 4 KiB allreduced (split, 64 allreduces, concat)", "%.1f" % (t_many * 1e6)),
                 ("1 x 256 KiB allreduced", "%.1f" % (t_one * 1e6)),
                 ("the same split/concat function without collectives", "%.1f" % (t_base * 1e6)),
                 ("ratio 64 x 4 KiB / 1 x 256 KiB", "%.2f" % (t_many / t_one))])


def idle_interference(rounds: int, reps: int) -> None:
    """Raw mpi4py Allreduce with tfhvd idle vs shut down, alternated."""
    src = np.ones(256, np.float32)  # 1 KiB: the most sensitive to a busy thread
    dst = np.empty_like(src)

    def raw_median() -> float:
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            COMM.Allreduce(src, dst, op=MPI.SUM)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    idle, off = [], []
    for _ in range(rounds):
        hvd.shutdown()
        COMM.Barrier()
        off.append(raw_median())
        hvd.init()
        # One GPU per process, its memory grown as needed (no-op without GPUs).
        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        hvd.allreduce(tf.ones([4]), name="warm")  # the runtime has run, now idles
        time.sleep(0.2)
        COMM.Barrier()
        idle.append(raw_median())
    t_idle = COMM.allreduce(statistics.median(idle), op=MPI.MAX)
    t_off = COMM.allreduce(statistics.median(off), op=MPI.MAX)
    print_table("Raw mpi4py Allreduce (1 KiB) while tfhvd is idle vs shut down",
                ("tfhvd state", "median (us)"),
                [("shut down", "%.2f" % (t_off * 1e6)),
                 ("initialised, idle", "%.2f" % (t_idle * 1e6)),
                 ("idle/off", "%.2f" % (t_idle / t_off))])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="timed repetitions per size")
    p.add_argument("--max-mib", type=int, default=64, help="largest size in MiB")
    p.add_argument("--skip-idle", action="store_true", help="skip the idle-interference test")
    p.add_argument("--eager-breakdown", action="store_true",
                   help="only the breakdown of one eager allreduce (--breakdown-kib)")
    p.add_argument("--breakdown-kib", type=int, default=1,
                   help="the size of --eager-breakdown's tensor, in KiB")
    args = p.parse_args()
    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    if hvd.rank() == 0:
        print("tfhvd %s, %d ranks, TensorFlow %s, %s" % (hvd.__version__, hvd.size(),
                                                        tf.__version__, MPI.Get_library_version().splitlines()[0]))
    if args.eager_breakdown:
        eager_breakdown(max(50, args.reps), args.breakdown_kib)
        return
    size_table(args.reps, args.max_mib << 20)
    many_small(max(20, args.reps // 4))
    if not args.skip_idle:
        idle_interference(rounds=5, reps=max(50, args.reps))


if __name__ == "__main__":
    main()
