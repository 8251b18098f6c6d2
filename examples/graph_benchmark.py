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
    ``DistributedGradientTape`` makes them), over its twin; and the same over a
    twin that keeps 64 ``AddV2`` nodes (TensorFlow's cost of 64 more nodes in the
    step, which the 64 allreduce nodes also pay);
  * one 256 KiB allreduce over its twin, and the ratio of the two rows above;
  * ``model.fit`` of a small MLP (Flatten, Dense(64), Dense(10); batch 32) with
    ``hvd.DistributedOptimizer`` against the plain optimizer, paired epochs in one
    job: the throughput ratio and the extra CPU time per step; and the same against
    a reference that averages the gradients with mpi4py's ``Allreduce`` inside a
    ``tf.py_function`` (TensorFlow's own cost plus the raw transport: the bar).

``--probe-64 N`` only calls the 64-op function N times (for ``TFHVD_LOG_LEVEL=debug``'s round
lines, or ``perf``; ``scripts/compare_builds.sh`` uses it).

``--large`` runs other collective rows instead: one allreduce (``op=Average``, as gradients
are averaged) of a tensor the step produces (``t * 2.0``), of 256 KiB, 4 MiB and 16 MiB, over
the same function without it.  A tensor that only the collective consumes is forwarded to its
output (the collective runs in place, with no output allocation and no fresh pages).

``--floor`` runs issue 13's collective rows beside what any implementation of the same
graph must pay on this machine: mpi4py's ``Allreduce`` of 1 KiB and 256 KiB called from the
step (a ``tf.numpy_function``, over the same function whose ``numpy_function`` only copies,
so the rows hold the transport and the ranks' meeting, not Python's call), and TensorFlow's
cost of 64 more nodes in the step: 64 ``AddV2``, and 64 asynchronous nodes that complete at
once (``TfhvdAsyncIdentity``, a reference op of the library), each over the plain twin.
The 64 asynchronous nodes plus mpi4py's 256 KiB ``Allreduce`` from the step are the floor
of the 64-op row and of its ratio to one 256 KiB allreduce: a runtime that cost nothing
would still measure them.

``--compare-inline`` runs the collective rows with ``TFHVD_GRAPH_INLINE`` on and off,
alternating in the same processes: a graph op that was alone in its last round runs
tfhvd's loop on its own executor thread instead of waking tfhvd's background thread.

tfhvd asks Open MPI to yield while it waits (``TFHVD_MPI_YIELD_WHEN_IDLE``, on by
default, when tfhvd initialises MPI); run with ``-x TFHVD_MPI_YIELD_WHEN_IDLE=0`` to
see the cost of MPI's spinning waits.
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow import mpi_ops


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


def collective_cases(reps: int) -> List[Tuple[str, Callable[[], object], Callable[[], object], int]]:
    """The collective rows: (title, function, twin, repeats)."""
    small = tf.ones([256], tf.float32)        # 1 KiB
    big = tf.ones([64 * 1024], tf.float32)    # 256 KiB

    @tf.function
    def one_small(t):
        return hvd.allreduce(t, op=hvd.Sum, name="probe_1k") + 1.0

    @tf.function
    def plus_one_twin(t):
        return t * 1.0 + 1.0

    @tf.function
    def many(t):
        parts = tf.split(t, 64)
        return tf.concat([hvd.allreduce(p, op=hvd.Sum, name="probe_4k_%d" % i)
                          for i, p in enumerate(parts)], 0)

    @tf.function
    def many_twin(t):
        return tf.concat([p * 1.0 for p in tf.split(t, 64)], 0)

    # The twin above holds no node per tensor (grappler folds p * 1.0 away).
    # This one keeps 64 AddV2 nodes (c is an argument, so nothing folds): the
    # difference between the two twins is TensorFlow's executor running 64
    # more nodes in the step, which the 64 allreduce nodes cost it too.
    @tf.function
    def many_add_twin(t, c):
        return tf.concat([p + c for p in tf.split(t, 64)], 0)

    zero = tf.constant(0.0)

    @tf.function
    def one_big(t):
        return hvd.allreduce(t, op=hvd.Sum, name="probe_256k") + 1.0

    return [("1 x 1 KiB allreduce", lambda: one_small(small), lambda: plus_one_twin(small), reps),
            ("64 x 4 KiB allreduces", lambda: many(big), lambda: many_twin(big),
             max(20, reps // 2)),
            ("64 x 4 KiB allreduces, over a twin of 64 adds", lambda: many(big),
             lambda: many_add_twin(big, zero), max(20, reps // 2)),
            ("1 x 256 KiB allreduce", lambda: one_big(big), lambda: plus_one_twin(big), reps)]


def floor_cases(reps: int) -> List[Tuple[str, Callable[[], object], Callable[[], object], int]]:
    """``--floor``: the raw transport called from the step, and TensorFlow's 64 more nodes."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def raw_allreduce(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=MPI.SUM)
        return out

    def copy(x: np.ndarray) -> np.ndarray:
        return np.array(x)  # the same call and output allocation, no transport

    small = tf.ones([256], tf.float32)
    big = tf.ones([64 * 1024], tf.float32)

    def step(body: Callable[[np.ndarray], np.ndarray]) -> Callable[[tf.Tensor], tf.Tensor]:
        @tf.function
        def f(t):
            out = tf.numpy_function(body, [t], tf.float32, stateful=True)
            return tf.reshape(out, tf.shape(t)) + 1.0
        return f

    raw, copied = step(raw_allreduce), step(copy)
    async_identity = mpi_ops._ops().tfhvd_async_identity

    @tf.function
    def many_async(t):
        return tf.concat([async_identity(p) for p in tf.split(t, 64)], 0)

    ours = collective_cases(reps)
    plain_twin, add_twin = ours[1][2], ours[2][2]  # the 64-op row's two twins
    return [t for t in ours if t[0] != "64 x 4 KiB allreduces, over a twin of 64 adds"] + [
        (RAW_1K, lambda: raw(small), lambda: copied(small), reps),
        (RAW_256K, lambda: raw(big), lambda: copied(big), reps),
        (NODES_64, add_twin, plain_twin, max(20, reps // 2)),
        (ASYNC_64, lambda: many_async(big), plain_twin, max(20, reps // 2))]


RAW_1K = "raw 1 KiB Allreduce in the step"
RAW_256K = "raw 256 KiB Allreduce in the step"
NODES_64 = "TensorFlow's 64 more nodes (64 adds over the plain twin)"
ASYNC_64 = "TensorFlow's 64 asynchronous nodes (64 TfhvdAsyncIdentity over the plain twin)"


def print_floor(results: Dict[str, List[Tuple[float, float, float, float]]]) -> None:
    """The floor of the 64-op row and of its ratio, beside tfhvd's, from ``--floor``'s rows."""
    if hvd.rank() != 0:
        return
    over = _over_twin(results)
    ours_64, ours_256 = over["64 x 4 KiB allreduces"], over["1 x 256 KiB allreduce"]
    # The raw transport called from the step (ranks meeting included); tfhvd's own
    # 256 KiB row is often below the twin's noise, so it would make no denominator.
    transport = over[RAW_256K]
    floor_64 = over[ASYNC_64] + transport
    ratio = lambda a, b: "%.2f" % (a / b) if b > 0 else "n/a (256 KiB <= 0)"  # noqa: E731
    print_table("The floor: what the same graph costs with the raw transport and no runtime",
                ("figure", "floor (us or ratio)", "tfhvd (us or ratio)", "target"),
                [("1 x 1 KiB over its twin", us(over[RAW_1K]),
                  us(over["1 x 1 KiB allreduce"]), "<= 30 us"),
                 ("64 x 4 KiB over the plain twin (64 async nodes + 256 KiB transport)",
                  us(floor_64), us(ours_64), "<= 260 us"),
                 ("1 x 256 KiB over its twin", us(transport), us(ours_256), ""),
                 ("64 x 4 KiB / 1 x 256 KiB", ratio(floor_64, transport),
                  ratio(ours_64, ours_256), "<= 1.5")])


def large_cases(reps: int) -> List[Tuple[str, Callable[[], object], Callable[[], object], int]]:
    """``--large``: one allreduce of a tensor the step produces, as gradients are."""
    cases = []
    for kib in (256, 4096, 16384):
        t = tf.ones([kib * 256], tf.float32)

        @tf.function
        def produced(t, kib=kib):
            return hvd.allreduce(t * 2.0, op=hvd.Average, name="probe_large_%d" % kib) + 1.0

        @tf.function
        def twin(t):
            return t * 2.0 + 1.0

        size = "%d KiB" % kib if kib < 1024 else "%d MiB" % (kib // 1024)
        cases.append(("1 x %s allreduce of a tensor the step produces" % size,
                      lambda f=produced, t=t: f(t), lambda f=twin, t=t: f(t),
                      reps if kib < 4096 else max(20, reps // 4)))
    return cases


def us(seconds: float) -> str:
    """Seconds as a table cell in microseconds."""
    return "%.1f" % (seconds * 1e6)


def _over_twin(results: Dict[str, List[Tuple[float, float, float, float]]]) -> Dict[str, float]:
    """Each row's paired difference over its twin, the median of its rounds (seconds)."""
    return {t: statistics.median(r[2] for r in results[t]) for t in results}


def print_collectives(results: Dict[str, List[Tuple[float, float, float, float]]], reps: int,
                      rounds: int, label: str = "") -> None:
    """One table of the collective rows (each the median of its rounds), and the ratio."""
    rows = []
    for title, per_round in results.items():
        r = [statistics.median(x) for x in zip(*per_round)]
        rounds_col = " ".join("%.0f" % (x[2] * 1e6) for x in per_round)
        rows.append((title, us(r[0]), us(r[1]), us(r[2]), us(r[3]), rounds_col))
    print_table("Collectives in a tf.function over the same function without them%s "
                "(median of %d, slowest rank; median of %d rounds)" % (label, reps, rounds),
                ("function", "with (us)", "twin (us)", "over twin, paired (us)",
                 "spread of paired (IQR, us)", "over twin, each round (us)"), rows)
    if hvd.rank() == 0 and "1 x 256 KiB allreduce" in results:
        over = _over_twin(results)
        ratio = over["64 x 4 KiB allreduces"] / over["1 x 256 KiB allreduce"]
        print("\n64 x 4 KiB over twin / 1 x 256 KiB over twin: %.2f" % ratio, flush=True)


def collective_rows(reps: int, rounds: int = 1, large: bool = False,
                    floor: bool = False) -> None:
    cases = (large_cases(reps) if large else floor_cases(reps) if floor
             else collective_cases(reps))
    results: Dict[str, List[Tuple[float, float, float, float]]] = {t: [] for t, *_ in cases}
    for _ in range(rounds):
        for title, fn, twin, n in cases:
            results[title].append(paired(fn, twin, n))
    print_collectives(results, reps, rounds)
    if floor:
        print_floor(results)


def reinit(graph_inline: str) -> None:
    """Shuts tfhvd down and initialises it again with TFHVD_GRAPH_INLINE set."""
    hvd.shutdown()
    os.environ["TFHVD_GRAPH_INLINE"] = graph_inline
    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def compare_inline(reps: int, rounds: int) -> None:
    """The collective rows with TFHVD_GRAPH_INLINE on and off, in the same
    processes: each round runs both settings (re-initialising tfhvd between
    them, in alternating order), so both see the same machine."""
    cases = collective_cases(reps)
    results = {v: {t: [] for t, *_ in cases} for v in ("1", "0")}
    for r in range(rounds):
        for v in (("1", "0") if r % 2 == 0 else ("0", "1")):
            reinit(v)
            for title, fn, twin, n in cases:
                results[v][title].append(paired(fn, twin, n))
    for v, label in (("1", ", TFHVD_GRAPH_INLINE=1"), ("0", ", TFHVD_GRAPH_INLINE=0")):
        print_collectives(results[v], reps, rounds, label)
    reinit("1")


def _mpi4py_reference(keras: Any) -> Any:
    """An SGD whose gradients are averaged by mpi4py's Allreduce inside a
    ``tf.py_function``: the raw transport, called from the training step."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def average(*grads: tf.Tensor) -> List[np.ndarray]:
        flat = np.concatenate([g.numpy().ravel() for g in grads])
        out = np.empty_like(flat)
        comm.Allreduce(flat, out)
        out /= comm.size
        res, off = [], 0
        for g in grads:
            n = int(np.prod(g.shape))
            res.append(out[off:off + n].reshape(g.shape))
            off += n
        return res

    class MPI4PySGD(keras.optimizers.SGD):
        def _clip_gradients(self, grads):
            out = tf.py_function(average, list(grads), [g.dtype for g in grads])
            for o, g in zip(out, grads):
                o.set_shape(g.shape)
            return super()._clip_gradients(out)

    return MPI4PySGD(0.01)


def mlp_rows(pairs: int, steps: int) -> None:
    """Paired epochs of a small MLP: DistributedOptimizer against the plain
    optimizer, and against mpi4py's Allreduce called from the step (the bar:
    TensorFlow's cost plus the raw transport)."""
    import keras

    import tfhvd.keras as hvd_keras

    rng = np.random.default_rng(hvd.rank())
    x = rng.random((steps * 32, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, steps * 32)

    def model(optimizer: Any) -> "keras.Model":
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
        m.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.fit(x[:64], y[:64], batch_size=32, epochs=1, verbose=0)  # warm-up: tracing
        return m

    models = {"plain": model(keras.optimizers.SGD(0.01)),
              "tfhvd": model(hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01))),
              "mpi4py": model(_mpi4py_reference(keras))}

    def epoch(m: Any) -> Tuple[float, float]:
        _sync()
        c0, t0 = time.process_time(), time.perf_counter()
        m.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        return time.perf_counter() - t0, time.process_time() - c0

    runs = ["tfhvd", "mpi4py"]
    ratios: Dict[str, List[float]] = {k: [] for k in runs}
    cpu: Dict[str, List[float]] = {k: [] for k in runs}
    for _ in range(pairs):
        tp, cp = epoch(models["plain"])
        for k in runs:
            td, cd = epoch(models[k])
            ratios[k].append(tp / td)
            cpu[k].append(cd / cp - 1.0)
    rows = []
    for k in runs:
        q1, med, q3 = _quantiles(ratios[k])
        worst = hvd.allreduce(tf.constant([-med, statistics.median(cpu[k])], tf.float64),
                              op=hvd.Max, name="mlp_row").numpy()
        rows.append((k, "%.3f" % -worst[0], "%.3f to %.3f" % (q1, q3),
                     "%+.1f%%" % (worst[1] * 100)))
    print_table("Keras fit, small MLP (batch 32, %d steps an epoch), %d paired epochs: "
                "throughput over the plain optimizer's" % (steps, pairs),
                ("gradients averaged by", "throughput ratio (median, worst rank)",
                 "spread on rank 0 (q1 to q3)", "extra CPU time (median, worst rank)"), rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200, help="timed repeats per row")
    p.add_argument("--mlp-pairs", type=int, default=5, help="paired epochs of the MLP")
    p.add_argument("--mlp-steps", type=int, default=200, help="steps in each MLP epoch")
    p.add_argument("--skip-mlp", action="store_true", help="skip the Keras fit rows")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds of the collective rows (each row: the median of the rounds)")
    p.add_argument("--probe-64", type=int, default=0, metavar="N",
                   help="only call the 64 x 4 KiB function N times and print nothing (for "
                        "TFHVD_LOG_LEVEL=debug's round lines, or perf; scripts/compare_builds.sh)")
    rows = p.add_mutually_exclusive_group()
    rows.add_argument("--large", action="store_true",
                   help="collective rows of one 256 KiB, 4 MiB and 16 MiB allreduce of a tensor "
                        "the step produces, instead of issue 13's rows")
    rows.add_argument("--floor", action="store_true",
                   help="issue 13's collective rows beside the raw transport called from the "
                        "step and TensorFlow's 64 more nodes: the floor of the 64-op row")
    rows.add_argument("--compare-inline", action="store_true",
                   help="the collective rows with TFHVD_GRAPH_INLINE=1 and =0, alternating "
                        "in the same processes (re-initialising tfhvd between them)")
    args = p.parse_args()
    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    if args.probe_64:
        _, many, _, _ = collective_cases(1)[1]
        for _ in range(args.probe_64):
            many()
        return
    if hvd.rank() == 0:
        print("tfhvd %s, %d ranks, TensorFlow %s, OMP_NUM_THREADS=%s"
              % (hvd.__version__, hvd.size(), tf.__version__,
                 os.environ.get("OMP_NUM_THREADS", "unset")), flush=True)
    if args.compare_inline:
        compare_inline(args.reps, max(2, args.rounds))
    else:
        collective_rows(args.reps, args.rounds, args.large, args.floor)
    if not args.skip_mlp:
        for v in (("1", "0") if args.compare_inline else (None,)):
            if v is not None:
                reinit(v)
                if hvd.rank() == 0:
                    print("\nTFHVD_GRAPH_INLINE=%s:" % v, flush=True)
            mlp_rows(args.mlp_pairs, args.mlp_steps)


if __name__ == "__main__":
    main()
