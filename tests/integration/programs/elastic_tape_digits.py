"""Elastic version of tape_digits.py: the same custom loop inside
``hvd.elastic.run``, with the model, the optimizer and the step count in an
elastic state, so training goes on when workers leave or join.

    tfhvdrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \\
        python elastic_tape_digits.py

``state.commit()`` after every step saves the state in host memory (a failed
exchange rolls back to it) and is where a host change is noticed.  After a
reset, the reset callback scales the learning rate to the new world size, and
the next round starts from rank 0's committed state (a newcomer gets it too).
Batches are picked by step number and rank, so the data follow the world.
"""

import argparse

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd
from _support import CommitWatch, digits, rank_share, report_weights


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--commit-log", help="log rank 0's commits here (tests)")
    parser.add_argument("--hold", default="", help="N:SIZE,... (see _support.CommitWatch)")
    args = parser.parse_args()

    hvd.init()
    (x_all, y_all), _ = digits()
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10),
    ])
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    cross_entropy = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(images, labels, exchange=True):
        with tf.GradientTape() as tape:
            loss = cross_entropy(labels, model(images, training=True))
        if exchange:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def batch(step):
        x, y = rank_share((x_all, y_all), hvd.rank(), hvd.size())
        pick = np.random.default_rng([step, hvd.rank()]).choice(len(x), args.batch_size)
        return x[pick], y[pick]

    # One local step creates the optimizer's slots before the state copies
    # them; it exchanges nothing (a newcomer must not, before hvd.elastic.run).
    train_step(*batch(0), exchange=False)
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
    watch = CommitWatch(hvd, args.commit_log, args.hold)

    def on_reset():
        opt.learning_rate.assign(args.lr * hvd.size())
        if hvd.rank() == 0:
            print("reset: %d rank(s), learning rate %g, from step %d"
                  % (hvd.size(), float(opt.learning_rate), state.step), flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        while state.step < args.steps:
            loss = train_step(*batch(state.step))
            if hvd.rank() == 0 and state.step % args.log_every == 0:
                print("step %d: loss %.4f (%d rank(s))" % (state.step, float(loss), hvd.size()),
                      flush=True)
            state.step += 1
            state.commit()
            watch(state)

    train(state)
    print("rank %d done: step %d of %d, %d rank(s), learning rate %g" % (
        hvd.rank(), state.step, args.steps, hvd.size(), float(opt.learning_rate)), flush=True)
    report_weights(hvd.rank(), model.trainable_variables)
    if hvd.rank() == 0:
        tf.train.Checkpoint(model=model, optimizer=opt).save("ckpt/elastic_digits")


if __name__ == "__main__":
    main()
