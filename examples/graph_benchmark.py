"""Graph-mode probes: what a collective costs inside ``tf.function`` and Keras ``fit``.

    mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 python examples/graph_benchmark.py

Every figure is measured against a twin: the same function (or the same model and
optimizer) without collectives, run alternately in the same processes, so both see
the same machine noise.  Each row reports the median over repeats of the paired
difference (collective function minus its twin, each timed right beside the other)
and the spread of those differences (25th to 75th percentile), which says whether a
median can be believed on a shared machine.

Rows (issue 13's table):
  * one 1 KiB allreduce in a ``tf.function``, over its twin;
  * 64 allreduces of 4 KiB in one ``tf.function`` (one op per tensor, as
    ``DistributedGradientTape`` makes them), over its twin;
  * one 256 KiB allreduce over its twin, and the ratio of the two rows above;
  * ``model.fit`` of a small MLP (Flatten, Dense(64), Dense(10); batch 32) with
    ``hvd.DistributedOptimizer`` against the plain optimizer, paired epochs in one
    job: the throughput ratio and the extra CPU time per step.
"""

import argparse
import os
import statistics
import sys
import time
from typing import Callable, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd


def _sync() -> None:
    """A cheap barrier, so both ranks start each timed call together."""
    hvd.allreduce(tf.zeros([1]), op=hvd.Sum, name="graph_bench_sync")


def _quantiles(xs: Sequence[float]) -> Tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 4 else [min(xs), statistics.median(xs),
                                                              max(xs)]
    return q[0], statistics.median(xs), q[2]


def paired(fn: Callable[[], object], twin: Callable[[], object], reps: int
           ) -> Tuple[float, float, float, float]:
    """Median seconds of ``fn``, of ``twin``, and the quartiles' spread of the paired
    difference fn - twin, as (fn, twin, diff_median, diff_iqr); the slowest rank's."""
    for _ in range(5):
        fn()
        twin()
    diffs: List[float] = []
    ta: List[float] = []
    tb: List[float] = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        _sync()
        t2 = time.perf_counter()
        twin()
        t3 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t3 - t2)
        diffs.append((t1 - t0) - (t3 - t2))
    q1, med, q3 = _quantiles(diffs)
    row = np.array([statistics.median(ta), statistics.median(tb), med, q3 - q1], np.float64)
    return tuple(float(v) for v in hvd.allreduce(tf.constant(row), op=hvd.Max,
                                                   name="graph_bench_row").numpy())


def print_table(title: str, header: Sequence[str], rows: List[Sequence[str]]) -> None:
    if hvd.rank() != 0:
        return
    print("\n## " + title)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    sys.stdout.flush()


def collective_rows(reps: int) -> None:
    small = tf.ones([256], tf.float32)        # 1 KiB
    big = tf.ones([64 * 1024], tf.float32)    # 256 KiB

    @tf.function
    def one_small(t):
        return hvd.allreduce(t, op=hvd.Sum, name="probe_1k") + 1.0

    @tf.function
    def one_small_twin(t):
        return t * 1.0 + 1.0

    @tf.function
    def many(t):
        parts = tf.split(t, 64)
        return tf.concat([hvd.allreduce(p, op=hvd.Sum, name="probe_4k_%d" % i)
                          for i, p in enumerate(parts)], 0)

    @tf.function
    def many_twin(t):
        return tf.concat([p * 1.0 for p in tf.split(t, 64)], 0)

    @tf.function
    def one_big(t):
        return hvd.allreduce(t, op=hvd.Sum, name="probe_256k") + 1.0

    @tf.function
    def one_big_twin(t):
        return t * 1.0 + 1.0

    r1 = paired(lambda: one_small(small), lambda: one_small_twin(small), reps)
    r64 = paired(lambda: many(big), lambda: many_twin(big), max(20, reps // 2))
    r256 = paired(lambda: one_big(big), lambda: one_big_twin(big), reps)
    us = lambda s: "%.1f" % (s * 1e6)  # noqa: E731
    rows = [("1 x 1 KiB allreduce", us(r1[0]), us(r1[1]), us(r1[2]), us(r1[3])),
            ("64 x 4 KiB allreduces", us(r64[0]), us(r64[1]), us(r64[2]), us(r64[3])),
            ("1 x 256 KiB allreduce", us(r256[0]), us(r256[1]), us(r256[2]), us(r256[3]))]
    print_table("Collectives in a tf.function over the same function without them "
                "(median of %d, slowest rank)" % reps,
                ("function", "with (us)", "twin (us)", "over twin, paired (us)",
                 "spread of paired (IQR, us)"), rows)
    if hvd.rank() == 0:
        ratio = r64[2] / r256[2] if r256[2] > 0 else float("nan")
        print("\n64 x 4 KiB over twin / 1 x 256 KiB over twin: %.2f" % ratio, flush=True)


def mlp_rows(pairs: int, steps: int) -> None:
    """Paired epochs of a small MLP: DistributedOptimizer against the plain optimizer."""
    import keras

    import tfhvd.keras as hvd_keras

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((steps * 32, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, steps * 32)

    def model() -> "keras.Model":
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                                 keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(10)])

    dist = model()
    dist.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain = model()
    plain.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for m in (dist, plain):  # warm-up: tracing
        m.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)

    def epoch(m) -> Tuple[float, float]:
        _sync()
        c0, t0 = time.process_time(), time.perf_counter()
        m.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        return time.perf_counter() - t0, time.process_time() - c0

    ratios, cpu = [], []
    for _ in range(pairs):
        td, cd = epoch(dist)
        tp, cp = epoch(plain)
        ratios.append(tp / td)
        cpu.append(cd / cp - 1.0)
    q1, med, q3 = _quantiles(ratios)
    row = np.array([-med, cpu and statistics.median(cpu)], np.float64)
    worst = hvd.allreduce(tf.constant(row), op=hvd.Max, name="mlp_row").numpy()
    print_table("Keras fit, small MLP (batch 32, %d steps an epoch), %d paired epochs"
                % (steps, pairs),
                ("figure", "value"),
                [("throughput DistributedOptimizer / plain (median, worst rank)",
                  "%.3f" % -worst[0]),
                 ("spread of the paired ratios on rank 0 (q1 to q3)", "%.3f to %.3f" % (q1, q3)),
                 ("extra CPU time per epoch (median, worst rank)", "%+.1f%%" % (worst[1] * 100))])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="timed repeats per row")
    p.add_argument("--mlp-pairs", type=int, default=5, help="paired epochs of the MLP")
    p.add_argument("--mlp-steps", type=int, default=200, help="steps in each MLP epoch")
    p.add_argument("--skip-mlp", action="store_true", help="skip the Keras fit rows")
    args = p.parse_args()
    hvd.init()
    if hvd.rank() == 0:
        print("tfhvd %s, %d ranks, TensorFlow %s, OMP_NUM_THREADS=%s"
              % (hvd.__version__, hvd.size(), tf.__version__,
                 os.environ.get("OMP_NUM_THREADS", "unset")), flush=True)
    collective_rows(args.reps)
    if not args.skip_mlp:
        mlp_rows(args.mlp_pairs, args.mlp_steps)


if __name__ == "__main__":
    main()
