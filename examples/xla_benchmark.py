"""Keras ``fit`` throughput with XLA on and off, distributed and without exchange.

    mpirun -np 2 python examples/xla_benchmark.py

For three models, the ``make demo`` CNN on scikit-learn's digits
(examples/keras_mnist.py), the synthetic-benchmark CNN on 32x32x3 random
images (examples/keras_synthetic_benchmark.py), and a deep narrow MLP (many
small ops, where XLA is faster than TensorFlow's kernels even on a CPU), it
builds four copies from the same weights:

* ``tfhvd xla``: ``hvd.DistributedOptimizer``, ``jit_compile=True`` (the train
  step split into compiled parts around the reduction, docs/keras.md);
* ``tfhvd``: ``hvd.DistributedOptimizer``, ``jit_compile=False``;
* ``alone xla`` / ``alone``: the plain optimizer, each rank training on its own
  data with no exchange at all, with and without XLA (the ceiling).

All four live in the same processes; after a warm-up that traces and compiles
every step, they take turns of ``--steps`` batches each (one ``fit`` epoch,
after a barrier), in an order that rotates every repeat.  A turn's throughput
is the slowest rank's samples per second (per rank).  The table gives each
copy's median over ``--repeats`` and, for each comparison, the median of the
per-repeat ratios with their range (min-max), because a shared machine's speed
drifts and only turns close in time compare fairly.
"""

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

CONFIGS = ["tfhvd xla", "tfhvd", "alone xla", "alone"]
RATIOS = [("tfhvd xla", "alone xla"), ("tfhvd", "alone"), ("tfhvd xla", "tfhvd"),
          ("alone xla", "alone")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7, help="turns of each copy")
    p.add_argument("--steps", type=int, default=0,
                   help="batches per turn (0: 120 digits CNN, 30 synthetic CNN, 200 MLP)")
    p.add_argument("--tasks", default="digits,synthetic,mlp")
    p.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra- and inter-op threads per rank (0: TF's default)")
    return p.parse_args(argv)


def digits_task(keras: Any, tf: Any, rank: int, size: int) -> Dict[str, Any]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from keras_mnist import build_model, load_data, shard

    (x_train, y_train), _ = load_data(None)
    batch = 32
    x, y = shard(x_train, y_train, rank, size, batch)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    return dict(name="digits CNN (make demo)", batch=batch, steps=120, data=data.repeat(),
                build=lambda: build_model(x_train.shape[1:]),
                loss="sparse_categorical_crossentropy", lr=0.002 * size)


def synthetic_task(keras: Any, tf: Any, rank: int, size: int) -> Dict[str, Any]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from keras_synthetic_benchmark import build_model

    batch = 32
    images = tf.random.uniform([batch, 32, 32, 3], seed=rank)
    labels = tf.random.uniform([batch], maxval=10, dtype=tf.int32, seed=rank)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    return dict(name="synthetic CNN 32x32x3", batch=batch, steps=30, data=data,
                build=lambda: build_model(keras, "cnn", 32),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), lr=0.01)


def mlp_task(keras: Any, tf: Any, rank: int, size: int) -> Dict[str, Any]:
    """A deep narrow MLP: many small ops, where XLA's fusion beats TensorFlow's per-op
    dispatch even on a CPU (the two CNNs are slower with XLA on this machine)."""
    batch = 64
    x = tf.random.uniform([batch * 16, 32], seed=rank)
    y = tf.random.uniform([batch * 16], maxval=10, dtype=tf.int32, seed=rank)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()

    def build():
        return keras.Sequential([keras.Input((32,))]
                                + [keras.layers.Dense(64, activation="relu") for _ in range(8)]
                                + [keras.layers.Dense(10)])

    return dict(name="MLP 32-64x8-10", batch=batch, steps=200, data=data, build=build,
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), lr=0.01)


def make_copies(keras: Any, hvd: Any, task: Dict[str, Any]) -> Dict[str, Any]:
    """The four compiled copies of the task's model, from the same weights."""
    copies = {}
    for config in CONFIGS:
        keras.utils.set_random_seed(1234)
        model = task["build"]()
        opt = keras.optimizers.SGD(task["lr"], momentum=0.9)
        if config.startswith("tfhvd"):
            opt = hvd.DistributedOptimizer(opt)
        model.compile(optimizer=opt, loss=task["loss"], jit_compile=config.endswith("xla"))
        copies[config] = model
    return copies


class TurnTimer:
    """Wall time of one ``fit`` epoch, batches only (not fit's set-up)."""

    def __init__(self, keras: Any) -> None:
        timer = self

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                timer._start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                timer.last = time.perf_counter() - timer._start

        self.callback = _Callback()
        self.last = 0.0
        self._start = 0.0


def run_task(keras: Any, hvd: Any, task: Dict[str, Any], args: Any) -> Dict[str, List[float]]:
    copies = make_copies(keras, hvd, task)
    steps = args.steps or task["steps"]
    timer = TurnTimer(keras)
    for config, model in copies.items():  # trace, compile and warm up, untimed
        model.fit(task["data"], epochs=1, steps_per_epoch=5, verbose=0)
        if config.startswith("tfhvd"):
            hvd.broadcast_variables(model.weights, root_rank=0)
    if not split_in_use(copies["tfhvd xla"]):
        raise RuntimeError("the 'tfhvd xla' copy does not run the split XLA step")
    seconds: Dict[str, List[float]] = {c: [] for c in CONFIGS}
    for rep in range(args.repeats):
        order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
        for config in order:
            hvd.barrier()
            copies[config].fit(task["data"], epochs=1, steps_per_epoch=steps, verbose=0,
                               callbacks=[timer.callback])
            seconds[config].append(timer.last)
    everyone = hvd.allgather_object(seconds, name="xla_benchmark_%s" % task["name"][:5])
    samples = steps * task["batch"]
    # Per turn, the slowest rank's throughput (samples/s per rank).
    return {c: [samples / max(r[c][i] for r in everyone) for i in range(args.repeats)]
            for c in CONFIGS}


def split_in_use(model: Any) -> bool:
    """Whether ``fit`` runs ``model``'s step split into compiled parts (tfhvd/_keras/xla_split)."""
    from tfhvd._keras import xla_split

    step = xla_split.step_of(model)
    return step is not None and step.split is True


def report(results: Dict[str, Dict[str, List[float]]], args: Any, size: int) -> None:
    print("\n%d ranks, %d repeats, %s threads per rank; samples/s per rank (the slowest rank's, "
          "median over turns); ratios: median of the per-repeat ratios, range min-max"
          % (size, args.repeats, args.threads or "default"))
    print("| model | tfhvd xla | tfhvd | alone xla | alone | %s |"
          % " | ".join("%s / %s" % pair for pair in RATIOS))
    print("|---|---:|---:|---:|---:|%s" % ("---:|" * len(RATIOS)))
    for name, thr in results.items():
        cells = ["%.0f" % statistics.median(thr[c]) for c in CONFIGS]
        for a, b in RATIOS:
            ratios = [x / y for x, y in zip(thr[a], thr[b], strict=True)]
            cells.append("%.2f (%.2f-%.2f)" % (statistics.median(ratios), min(ratios),
                                                max(ratios)))
        print("| %s | %s |" % (name, " | ".join(cells)))
    print("Targets: tfhvd xla / alone xla >= 0.9; tfhvd xla / tfhvd > 1 where "
          "alone xla / alone > 1.")


def main(argv=None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import tfhvd.keras as hvd

    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    makers: Dict[str, Callable] = {"digits": digits_task, "synthetic": synthetic_task,
                                   "mlp": mlp_task}
    results = {}
    for key in args.tasks.split(","):
        task = makers[key](keras, tf, hvd.rank(), hvd.size())
        results[task["name"]] = run_task(keras, hvd, task, args)
    if hvd.rank() == 0:
        report(results, args, hvd.size())
    return 0


if __name__ == "__main__":
    sys.exit(main())
