"""A custom TensorFlow 2 training loop made data parallel with
``hvd.DistributedGradientTape``: a small CNN learns scikit-learn's digits.

    tfhvdrun -np 2 python tape_digits.py
    tfhvdrun -np 2 python tape_digits.py --eager --tf1-optimizer

Each rank trains on its own share of the digits; the tape averages the
gradients over the ranks before the optimizer applies them, so every rank
makes the same update.  Rank 0's starting weights (and optimizer slots) are
sent to the others after the first step, when the slots exist.  The step runs
in a ``tf.function`` unless ``--eager``; ``--tf1-optimizer`` uses
``tf.compat.v1.train.AdamOptimizer`` with a global step (run it eagerly, and
with tf-keras: TF1 optimizers take ``tf.Variable``s).  Rank 0 alone writes the
checkpoint.
"""

import argparse
import os

import tensorflow as tf

import tfhvd.tensorflow as hvd
from _support import digits, rank_share, report_weights


def optimizer_variables(opt):
    """Keras 3 lists them in a property; tf-keras and TF1 optimizers in a method."""
    found = opt.variables
    return list(found() if callable(found) else found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eager", action="store_true", help="no tf.function around the step")
    parser.add_argument("--tf1-optimizer", action="store_true",
                        help="tf.compat.v1.train.AdamOptimizer with a global step")
    parser.add_argument("--checkpoint", default="ckpt/digits", help="prefix rank 0 saves to")
    args = parser.parse_args()

    hvd.init()
    for gpu in tf.config.list_physical_devices("GPU")[hvd.local_rank():][:1]:
        tf.config.set_visible_devices(gpu, "GPU")  # one GPU per rank, where there are any

    (x, y), _ = digits()
    x, y = rank_share((x, y), hvd.rank(), hvd.size())
    batches = iter(tf.data.Dataset.from_tensor_slices((x, y)).repeat()
                   .shuffle(len(x), seed=hvd.rank()).batch(args.batch_size))

    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    cross_entropy = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    scaled_lr = args.lr * hvd.size()  # the global batch grows with the ranks
    if args.tf1_optimizer:
        opt = tf.compat.v1.train.AdamOptimizer(scaled_lr)
        counter = {"global_step": tf.compat.v1.train.get_or_create_global_step()}
    else:
        opt = tf.keras.optimizers.Adam(scaled_lr)
        counter = {}

    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = cross_entropy(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables), **counter)
        return loss

    step = train_step if args.eager else tf.function(train_step)
    for n in range(args.steps):
        images, labels = next(batches)
        loss = step(images, labels)
        if n == 0:
            # Same start everywhere: rank 0's weights and its optimizer's slots,
            # which exist only now that one update has run.
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer_variables(opt), root_rank=0)
        if hvd.rank() == 0 and (n % args.log_every == 0 or n == args.steps - 1):
            print("step %d: loss %.4f" % (n, float(loss)), flush=True)

    if hvd.rank() == 0:
        saved = tf.train.Checkpoint(model=model, optimizer=opt).save(args.checkpoint)
        print("rank 0 saved %s" % os.path.relpath(saved))
    report_weights(hvd.rank(), model.trainable_variables)


if __name__ == "__main__":
    main()
