"""Data-parallel training with ``DistributedGradientTape`` in a custom loop.

Runs offline on the handwritten digits that ship with scikit-learn::

    mpirun -np 2 python examples/tensorflow_digits.py

Each rank trains on its own shard; gradients are averaged across ranks, so
every rank holds the same weights.  Rank 0 prints per-epoch loss and accuracy.
"""

import argparse

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfhvd.tensorflow as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    tf.random.set_seed(1234 + hvd.rank())  # different initial weights per rank...

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    shard = train[hvd.rank()::hvd.size()]  # each rank reads its own shard
    ds = (tf.data.Dataset.from_tensor_slices((x[shard], y[shard]))
          .shuffle(len(shard), seed=hvd.rank()).batch(args.batch_size))

    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # Scale the learning rate by the number of ranks (the global batch grows).
    opt = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)

    # ...then rank 0's weights everywhere before the first step.
    hvd.broadcast_variables(model.variables, root_rank=0)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    steps = len(shard) // args.batch_size
    for epoch in range(args.epochs):
        losses = []
        for xb, yb in ds.take(steps):  # same number of steps on every rank
            losses.append(train_step(xb, yb))
        # Average the epoch loss and the test accuracy over ranks.
        loss = hvd.allreduce(tf.reduce_mean(losses), name="epoch_loss").numpy()
        logits = model(x[test], training=False)
        acc = np.mean(np.argmax(logits, axis=1) == y[test])
        acc = hvd.allreduce(tf.constant(acc, tf.float32), name="epoch_acc").numpy()
        if hvd.rank() == 0:
            print("epoch %d: loss %.4f  test accuracy %.3f" % (epoch + 1, loss, acc), flush=True)

    # Every rank ends with the same weights.
    w = model.trainable_variables[0]
    spread = hvd.allreduce(w, op=hvd.Max) - hvd.allreduce(w, op=hvd.Min)
    if hvd.rank() == 0:
        print("ranks=%d, max weight difference across ranks: %.2e"
              % (hvd.size(), float(tf.reduce_max(spread))), flush=True)


if __name__ == "__main__":
    main()
