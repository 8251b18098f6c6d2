"""Training throughput on synthetic images (random pixels and labels, made on
each rank), in images per second, for the three ways of writing the step.

    tfhvdrun -np 2 python synthetic_benchmark.py --api tape --model ResNet50
    tfhvdrun -np 2 python synthetic_benchmark.py --api fit
    tfhvdrun -np 2 python synthetic_benchmark.py --api session --fp16-allreduce   # tf-keras
    tfhvdrun -np 2 --min-np 1 --host-discovery-script ./hosts.sh \\
        python synthetic_benchmark.py --api tape --elastic

``--api tape``: ``hvd.DistributedGradientTape`` in a ``tf.function``;
``fit``: Keras ``fit`` with ``hvd.DistributedOptimizer``; ``session``: a
TensorFlow 1.x graph (``tf.compat.v1``) with ``hvd.DistributedOptimizer``
around ``GradientDescentOptimizer``, run in a ``tf.Session`` (it needs tf-keras,
``TF_USE_LEGACY_KERAS=1``, since Keras 3 models do not build in TF1 graphs).
``--fp16-allreduce`` sends the gradients as float16 (``hvd.Compression.fp16``).

After warm-up steps the script times ``--iters`` rounds of
``--steps-per-iter`` steps and prints the mean rate per rank and in total.
Then, for ``tape`` and ``session``, it checks one exchange: with fp16
compression every averaged gradient is a float16 value widened to float32.

``--elastic`` (tape only) keeps the rounds done and their rates in an elastic
state, committed after each round, so the benchmark survives workers coming
and going; the learning rate follows the world size through a reset callback.
"""

import argparse
import os
import time

import numpy as np

from _support import CommitWatch, report_weights


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", choices=["tape", "fit", "session"], default="tape")
    p.add_argument("--model", default="ResNet50", help="a keras.applications model")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--steps-per-iter", type=int, default=10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01, help="for one rank")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--cpu", action="store_true", help="hide any GPU")
    p.add_argument("--elastic", action="store_true")
    p.add_argument("--commit-log", help="elastic: log rank 0's commits here (tests)")
    p.add_argument("--hold", default="", help="elastic: N:SIZE,... (see _support.CommitWatch)")
    args = p.parse_args()
    if args.elastic and args.api != "tape":
        p.error("--elastic goes with --api tape")
    return args


def fp16_exact(grads):
    """True when every value of every gradient survives a round trip to float16."""
    return all(np.array_equal(g, g.astype(np.float16).astype(g.dtype)) for g in grads)


def report(hvd, device, args, rates):
    """Rank 0's rounds: mean and standard deviation, for one rank and for all."""
    mean, sd = float(np.mean(rates)), float(np.std(rates))
    if hvd.rank() == 0:
        print("one %s: %.1f images/sec (sd %.1f over %d rounds)" % (device, mean, sd, len(rates)))
        print("%d %s(s) together: %.1f images/sec" % (hvd.size(), device, hvd.size() * mean),
              flush=True)


def timed_rounds(hvd, args, device, run_steps, rounds):
    rates = []
    for i in rounds:
        start = time.perf_counter()
        run_steps(args.steps_per_iter)
        rate = args.batch_size * args.steps_per_iter / (time.perf_counter() - start)
        if hvd.rank() == 0:
            print("round %d: %.1f images/sec per %s" % (i, rate, device), flush=True)
        rates.append(rate)
    return rates


def eager_apis(args, device):
    import tensorflow as tf

    if args.api == "fit":
        import tfhvd.tensorflow.keras as hvd
    else:
        import tfhvd.tensorflow as hvd
    hvd.init()
    tf.random.set_seed(hvd.rank())  # each rank its own data (and, before the broadcast, weights)
    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
    images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = tf.keras.optimizers.SGD(args.lr * hvd.size())
    log = lambda *a: hvd.rank() == 0 and print(*a, flush=True)  # noqa: E731
    log("model %s, %dx%d images, batch %d per rank, %d rank(s), fp16 allreduce: %s"
        % (args.model, args.image_size, args.image_size, args.batch_size, hvd.size(),
           args.fp16_allreduce))

    if args.api == "fit":
        opt = hvd.DistributedOptimizer(opt, compression=compression)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy",
                      experimental_run_tf_function=False)
        data = tf.data.Dataset.from_tensors((images, labels)).repeat()
        log("warming up")
        model.fit(data, steps_per_epoch=args.warmup_steps, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        log("timing")
        rates = timed_rounds(hvd, args, device, lambda n: model.fit(
            data, steps_per_epoch=n, epochs=1, verbose=0), range(args.iters))
        report(hvd, device, args, rates)
        report_weights(hvd.rank(), model.trainable_weights)
        return

    def gradients(distributed):
        with tf.GradientTape() as tape:
            loss = tf.keras.losses.sparse_categorical_crossentropy(
                labels, model(images, training=True))
        if distributed:
            tape = hvd.DistributedGradientTape(tape, compression=compression)
        return tape.gradient(loss, model.trainable_variables)

    @tf.function
    def train_step(distributed=True):
        opt.apply_gradients(zip(gradients(distributed), model.trainable_variables))

    def run_steps(n):
        for _ in range(n):
            train_step()

    if not args.elastic:
        train_step()
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
        log("warming up")
        run_steps(args.warmup_steps)
        log("timing")
        rates = timed_rounds(hvd, args, device, run_steps, range(args.iters))
    else:
        # One local step (no exchange) creates the optimizer's slots: a worker
        # that joins later must not run a collective before hvd.elastic.run.
        train_step(distributed=False)
        state = hvd.elastic.TensorFlowKerasState(model, opt, rounds=0, rates=[], warm=False)
        watch = CommitWatch(hvd, args.commit_log, args.hold)

        def rescale_lr():
            opt.learning_rate.assign(args.lr * hvd.size())
            log("reset: %d rank(s), learning rate %g" % (hvd.size(), float(opt.learning_rate)))

        state.register_reset_callbacks([rescale_lr])

        @hvd.elastic.run
        def benchmark(state):
            if not state.warm:
                log("warming up")
                run_steps(args.warmup_steps)
                state.warm = True
                state.commit()
                watch(state)
            while state.rounds < args.iters:
                rate, = timed_rounds(hvd, args, device, run_steps, [state.rounds])
                state.rates = state.rates + [rate]
                state.rounds += 1
                state.commit()
                watch(state)
            return state.rates

        rates = benchmark(state)
        print("rank %d done: round %d of %d, %d rank(s), learning rate %g" % (
            hvd.rank(), state.rounds, args.iters, hvd.size(), float(opt.learning_rate)), flush=True)
    report(hvd, device, args, rates)
    exact = fp16_exact([g.numpy() for g in tf.function(gradients)(True)])
    log("averaged gradients exactly float16: %s" % ("yes" if exact else "no"))
    report_weights(hvd.rank(), model.trainable_variables)


def session_api(args, device):
    import tensorflow.compat.v1 as tf

    tf.disable_v2_behavior()
    import tfhvd.tensorflow as hvd

    hvd.init()
    tf.set_random_seed(hvd.rank())
    model = getattr(tf.keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
    images = tf.random_uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random_uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, model(images, training=True))
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(tf.train.GradientDescentOptimizer(args.lr * hvd.size()),
                                   compression=compression, op=hvd.Average)
    grads_and_vars = opt.compute_gradients(loss)
    train_op = opt.apply_gradients(grads_and_vars)
    init, sync = tf.global_variables_initializer(), hvd.broadcast_global_variables(0)
    if hvd.rank() == 0:
        print("model %s (TF1 graph), %dx%d images, batch %d per rank, %d rank(s), "
              "fp16 allreduce: %s" % (args.model, args.image_size, args.image_size,
                                      args.batch_size, hvd.size(), args.fp16_allreduce))
    with tf.Session() as session:
        session.run(init)
        session.run(sync)

        def run_steps(n):
            for _ in range(n):
                session.run(train_op)

        run_steps(args.warmup_steps)
        rates = timed_rounds(hvd, args, device, run_steps, range(args.iters))
        report(hvd, device, args, rates)
        exact = fp16_exact(session.run([g for g, _ in grads_and_vars]))
        if hvd.rank() == 0:
            print("averaged gradients exactly float16: %s" % ("yes" if exact else "no"))
        report_weights(hvd.rank(), session.run(model.trainable_weights))


def main():
    args = parse_args()
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    device = "CPU" if args.cpu else "device"
    if args.api == "session":
        session_api(args, device)
    else:
        eager_apis(args, device)


if __name__ == "__main__":
    main()
