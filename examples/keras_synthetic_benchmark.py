"""Keras training throughput on synthetic images, and tfhvd's overhead against the
plain optimizer measured in the same processes.

Throughput (images/sec per rank and in total):

    mpirun -np 2 python examples/keras_synthetic_benchmark.py --model cnn
    mpirun -np 2 python examples/keras_synthetic_benchmark.py --model resnet50 \\
        --batch-size 8 --image-size 64 --num-iters 3

Overhead (``--compare``): two identical models train in the same processes,
one with ``hvd.DistributedOptimizer`` and one with the plain optimizer (which
exchanges nothing, so it is the ceiling on this machine).  Their epochs
alternate (A B B A ...), each after a barrier, and for every pair the script
takes the slowest rank's throughput of each model.  It reports the median over
pairs of distributed / plain, and the CPU time per epoch of both:

    mpirun -np 2 python examples/keras_synthetic_benchmark.py --compare --threads 1

Pairs, not separate runs, because a shared machine's speed drifts: only
back-to-back epochs inside one job compare fairly.

``--late-arrival`` instead measures what a step pays when one rank reaches the
gradient allreduce later than the others (jitter makes that the normal case):
rank 1 busy-waits, then times a small allreduce in a ``tf.function``.
"""

import argparse
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["cnn", "resnet50"], default="cnn")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--image-size", type=int, default=None,
                   help="square image side (default 32 for cnn, 224 for resnet50)")
    p.add_argument("--num-iters", type=int, default=10,
                   help="timed epochs (with --compare: pairs of epochs)")
    p.add_argument("--num-batches-per-iter", type=int, default=10, help="steps per epoch")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow intra- and inter-op threads per rank (0: TF's default)")
    p.add_argument("--fp16-allreduce", action="store_true", help="Compression.fp16")
    p.add_argument("--groups", type=int, default=0,
                   help="DistributedOptimizer(groups=N): N fused reductions (0: one)")
    p.add_argument("--compare", action="store_true",
                   help="alternate epochs with a plain-optimizer twin and report the ratio")
    p.add_argument("--late-arrival", action="store_true",
                   help="time an allreduce on a rank that arrives late, and exit")
    return p.parse_args(argv)


def build_model(keras, name, image_size):
    shape = (image_size, image_size, 3)
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=shape, classes=1000)
    # keras.io's "simple MNIST convnet", on 32x32x3 images: about 60k parameters.
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10),
    ])


class EpochTimer:
    """Wall and process-CPU time of each epoch, batches only (not fit's set-up)."""

    def __init__(self, keras):
        timer = self

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                timer._start = (time.perf_counter(), time.process_time())

            def on_epoch_end(self, epoch, logs=None):
                wall, cpu = timer._start
                timer.last = (time.perf_counter() - wall, time.process_time() - cpu)

        self.callback = _Callback()
        self.last = (0.0, 0.0)
        self._start = (0.0, 0.0)


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    import tfhvd.keras as hvd

    hvd.init()
    import tensorflow as tf
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    if args.late_arrival:
        return late_arrival(tf, hvd)
    rank, size = hvd.rank(), hvd.size()
    image_size = args.image_size or (224 if args.model == "resnet50" else 32)
    classes = 1000 if args.model == "resnet50" else 10
    images = tf.random.uniform([args.batch_size, image_size, image_size, 3], seed=rank)
    labels = tf.random.uniform([args.batch_size], maxval=classes, dtype=tf.int32, seed=rank)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=args.model == "cnn")
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    def compiled(distributed):
        keras.utils.set_random_seed(0)
        model = build_model(keras, args.model, image_size)
        opt = keras.optimizers.SGD(0.01)
        if distributed:
            opt = hvd.DistributedOptimizer(opt, compression=compression,
                                           groups=args.groups or None)
        model.compile(optimizer=opt, loss=loss)
        return model

    timer = EpochTimer(keras)
    models = {"tfhvd": compiled(True)}
    if args.compare:
        models["plain"] = compiled(False)
    for model in models.values():  # trace and warm up, outside the timing
        model.fit(data, epochs=1, steps_per_epoch=args.num_warmup_batches, verbose=0,
                  shuffle=False)
    hvd.broadcast_variables(models["tfhvd"].weights, root_rank=0)

    order = []
    for i in range(args.num_iters):
        pair = ["tfhvd", "plain"] if args.compare else ["tfhvd"]
        order += pair if i % 2 == 0 else pair[::-1]
    records = {name: [] for name in models}
    for name in order:
        hvd.barrier()
        models[name].fit(data, epochs=1, steps_per_epoch=args.num_batches_per_iter, verbose=0,
                         shuffle=False,
                         callbacks=[timer.callback])
        records[name].append(timer.last)

    args.parameters = models["tfhvd"].count_params()
    everyone = hvd.allgather_object(records, name="benchmark_records")
    if rank == 0:
        report(args, everyone, size, image_size)


def late_arrival(tf, hvd, delays_us=(0, 200, 500, 1000, 3000), reps=60):
    """Latency of a 4 KiB allreduce on the last rank, when it arrives late by each delay."""
    x = tf.ones([1024])
    fn = tf.function(lambda t: hvd.allreduce(t, name="late_arrival"))
    for _ in range(20):
        fn(x).numpy()
    rows = []
    for delay in delays_us:
        times = []
        for _ in range(reps):
            hvd.barrier()
            if hvd.rank() == hvd.size() - 1:
                end = time.perf_counter() + delay / 1e6
                while time.perf_counter() < end:  # busy, like a rank still computing
                    pass
            start = time.perf_counter()
            fn(x).numpy()
            times.append(time.perf_counter() - start)
        rows.append((delay, statistics.median(times) * 1e6))
    if hvd.rank() == hvd.size() - 1:
        print("| last rank arrives late by | its allreduce latency (median of %d) |" % reps)
        print("|---:|---:|")
        for delay, latency in rows:
            print("| %d us | %.0f us |" % (delay, latency))


def report(args, everyone, size, image_size):
    """Prints throughput per rank and in total, and with --compare the ratios."""
    images = args.batch_size * args.num_batches_per_iter
    print("Model: %s %dx%d (%d parameters), batch %d per rank, %d ranks, %s threads per rank%s"
          % (args.model, image_size, image_size, args.parameters, args.batch_size, size,
             args.threads or "default", ", fp16 allreduce" if args.fp16_allreduce else ""))
    for name in everyone[0]:
        per_rank = [[images / wall for wall, _ in recs[name]] for recs in everyone]
        rank_means = [statistics.mean(r) for r in per_rank]
        for r, values in enumerate(per_rank):
            print("  %-5s rank %d: %8.1f img/sec  (+-%.1f over %d epochs)"
                  % (name, r, statistics.mean(values), statistics.pstdev(values), len(values)))
        print("  %-5s total: %8.1f img/sec on %d ranks" % (name, sum(rank_means), size))
    if not args.compare:
        return
    n = len(everyone[0]["tfhvd"])
    ratios, cpu_dist, cpu_plain = [], [], []
    for i in range(n):
        slow_dist = min(images / recs["tfhvd"][i][0] for recs in everyone)
        slow_plain = min(images / recs["plain"][i][0] for recs in everyone)
        ratios.append(slow_dist / slow_plain)
        cpu_dist.append(max(recs["tfhvd"][i][1] for recs in everyone))
        cpu_plain.append(max(recs["plain"][i][1] for recs in everyone))
    extra_cpu = statistics.median(cpu_dist) / statistics.median(cpu_plain) - 1
    print("Pairs (tfhvd / plain throughput, slowest rank): %s"
          % " ".join("%.3f" % r for r in ratios))
    print("Median throughput ratio: %.3f   (target >= 0.9)" % statistics.median(ratios))
    print("CPU seconds per epoch (busiest rank, median): tfhvd %.3f, plain %.3f, extra %+.1f%%"
          "   (target <= +10%%)" % (statistics.median(cpu_dist), statistics.median(cpu_plain),
                                   100 * extra_cpu))


if __name__ == "__main__":
    sys.exit(main())
