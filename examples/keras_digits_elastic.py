"""Elastic Keras training on the handwritten digits that ship with scikit-learn.

Workers may die or join while it trains; it carries on from the last commit::

    printf 'localhost:2\\n' > hosts.txt
    tfhvdrun -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script 'cat hosts.txt' \\
        python examples/keras_digits_elastic.py --epochs 10

Edit ``hosts.txt`` while it runs (``localhost:1``, ``127.0.0.2:1`` ...) to
remove or add workers.  The global batch stays ``--global-batch`` whatever
the number of workers (each takes ``global / size`` examples of it, through
``hvd.elastic.ElasticDataset``), so a run that loses and regains workers ends
with the weights an uninterrupted run would have (up to float rounding).
"""

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfhvd.tensorflow.keras as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=48,
                        help="examples per step over all workers (divisible by every size)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batches-per-commit", type=int, default=1)
    args = parser.parse_args()

    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]

    tf.keras.utils.set_random_seed(1234)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # The global batch is constant, so the learning rate needs no rescaling
    # when workers come and go.
    opt = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
    data = hvd.elastic.ElasticDataset((x[train], y[train]),
                                      global_batch_size=args.global_batch, seed=1)
    # What a commit saves and a failure rolls back to: weights, momentum,
    # and the data position (epoch, batch).
    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
    state.register_reset_callbacks([
        lambda: hvd.rank() == 0 and print("reset: now %d workers" % hvd.size(), flush=True)])

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @hvd.elastic.run
    def fit(state):
        while state.epoch < args.epochs:
            losses = []
            for xb, yb in data.iter_epoch(state, batches_per_commit=args.batches_per_commit):
                losses.append(float(train_step(xb, yb)))
            if hvd.rank() == 0:
                acc = np.mean(np.argmax(model(x[test]), axis=1) == y[test])
                print("epoch %d: %d workers, loss %.4f, test accuracy %.3f"
                      % (state.epoch, hvd.size(), np.mean(losses or [0.0]), acc), flush=True)

    fit(state)


if __name__ == "__main__":
    main()
