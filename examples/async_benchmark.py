"""Throughput and final accuracy of the asynchronous modes against no exchange at all.

    mpirun -np 2 python examples/async_benchmark.py

For two tasks, the ``make demo`` task (examples/keras_mnist.py's digits and
CNN) and a small MLP on synthetic data (about 1 ms steps), it trains the same
model from the same weights with each mode, in one run, in interleaved order:

* ``none``: each rank trains alone on its shard (no collective at all);
* ``sync``: ``hvd.DistributedOptimizer`` (gradients averaged every step);
* ``stale1``: ``DistributedOptimizer(staleness=1)`` + ``DelayedGradientsCallback``;
* ``local2/4/8``: ``hvd.LocalSGD(period=k, warmup_steps=one epoch)``.

Throughput is samples per second per rank in ``fit`` over the epochs after
the first (which traces the step and, for local SGD, is the synchronous
warm-up), all of them together, then the median over ``--repeats``.  Accuracy is the final validation accuracy (rank 0's model; the
modes other than ``none`` end with identical weights on every rank).
"""

import argparse
import statistics
import time

import keras
import numpy as np

import tfhvd.keras as hvd

MODES = ["none", "sync", "stale1", "local2", "local4", "local8"]


def digits_task(rank: int, size: int):
    from keras_mnist import build_model, load_data, shard

    (x_train, y_train), (x_test, y_test) = load_data(None)
    batch = 32
    x, y = shard(x_train, y_train, rank, size, batch)
    return dict(name="digits CNN (make demo)", x=x, y=y, x_test=x_test, y_test=y_test,
                batch=batch, lr=0.002 * size, epochs=12,
                build=lambda: build_model(x_train.shape[1:]))


def mlp_task(rank: int, size: int):
    rng = np.random.default_rng(7)
    teacher = rng.normal(size=(32, 10)).astype("float32")
    x_all = rng.normal(size=(24000, 32)).astype("float32")
    y_all = np.argmax(x_all @ teacher + 0.5 * rng.normal(size=(24000, 10)), axis=1)
    x_train, y_train, x_test, y_test = x_all[:20000], y_all[:20000], x_all[20000:], y_all[20000:]
    batch = 64
    steps = len(x_train) // (size * batch)
    x, y = x_train[rank::size][:steps * batch], y_train[rank::size][:steps * batch]

    def build():
        return keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                                 keras.layers.Dense(256, activation="relu"),
                                 keras.layers.Dense(10, activation="softmax")])

    return dict(name="MLP 32-256-256-10", x=x, y=y, x_test=x_test, y_test=y_test,
                batch=batch, lr=0.001 * size, epochs=6, build=build)


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.times.append(time.perf_counter() - self._t0)


def run(task, mode: str):
    keras.utils.set_random_seed(1234)  # same initial weights on every rank and mode
    model = task["build"]()
    opt = keras.optimizers.Adam(task["lr"])
    steps_per_epoch = len(task["x"]) // task["batch"]
    timer = EpochTimer()
    callbacks = []
    if mode != "none":
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    if mode == "sync":
        opt = hvd.DistributedOptimizer(opt)
    elif mode == "stale1":
        opt = hvd.DistributedOptimizer(opt, staleness=1)
        callbacks.append(hvd.DelayedGradientsCallback())
    elif mode.startswith("local"):
        opt = hvd.DistributedOptimizer(opt)
        callbacks.append(hvd.LocalSGD(period=int(mode[5:]), warmup_steps=steps_per_epoch))
    callbacks.append(timer)
    # jit_compile=False for every mode: a step with tfhvd collectives runs without XLA,
    # so the baseline does too (the same model, only the exchange differs).
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)
    model.fit(task["x"], task["y"], batch_size=task["batch"], epochs=task["epochs"],
              shuffle=False, verbose=0, callbacks=callbacks)
    _, acc = model.evaluate(task["x_test"], task["y_test"], batch_size=256, verbose=0)
    # All epochs after the first together: one digits epoch is about 60 ms, where
    # a single slow epoch (a collection, a descheduled rank) would decide a median.
    later = timer.times[1:]
    return steps_per_epoch * task["batch"] * len(later) / sum(later), acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tasks", default="mlp,digits")
    args = parser.parse_args()
    hvd.init()
    import tensorflow as tf
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    makers = {"mlp": mlp_task, "digits": digits_task}
    tasks = [makers[t](hvd.rank(), hvd.size()) for t in args.tasks.split(",")]
    results = {(t["name"], m): [] for t in tasks for m in MODES}
    for rep in range(args.repeats):
        order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]  # rotate who goes first
        for task in tasks:
            for mode in order:
                results[(task["name"], mode)].append(run(task, mode))
    if hvd.rank() != 0:
        return
    print("\n%d ranks, %d repeats; throughput = samples/s per rank in fit (median); 'vs none' "
          "= the median of each repeat's ratio to that repeat's 'none', with its range"
          % (hvd.size(), args.repeats))
    print("| task | mode | samples/s | vs none | range | val. accuracy | vs sync (points) |")
    print("|---|---|---|---|---|---|---|")
    for task in tasks:
        name = task["name"]
        thr = {m: statistics.median(r[0] for r in results[(name, m)]) for m in MODES}
        acc = {m: statistics.median(r[1] for r in results[(name, m)]) for m in MODES}
        for m in MODES:
            ratios = [a[0] / b[0] for a, b in zip(results[(name, m)], results[(name, "none")])]
            print("| %s | %s | %.0f | %.2f | %.2f-%.2f | %.4f | %+.1f |" % (
                name, m, thr[m], statistics.median(ratios), min(ratios), max(ratios), acc[m],
                100 * (acc[m] - acc["sync"])))


if __name__ == "__main__":
    main()
