"""A TensorFlow 1.x graph program (through ``tf.compat.v1``) made data parallel:
``hvd.DistributedOptimizer`` around a TF1 optimizer, a
``tf.train.MonitoredTrainingSession`` and ``hvd.BroadcastGlobalVariablesHook``.

    tfhvdrun -np 2 python tf1_monitored_session.py --steps 200

A two-layer perceptron on scikit-learn's digits (flattened to 64 features),
fed through placeholders.  The hook runs the broadcast of every global
variable from rank 0 once the session exists; the optimizer averages the
gradients over the ranks; the number of steps is shared by every rank
(``StopAtStepHook`` on the global step).  Rank 0 alone gets a checkpoint
directory, so it alone writes checkpoints.  At the end each rank reports its
weights and its accuracy on the held-out digits.
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf

import tfhvd.tensorflow as hvd
from _support import digits, rank_share, report_weights

tf.disable_v2_behavior()


class ReportAtEnd(tf.train.SessionRunHook):
    """Evaluates the model on the test digits and prints the weights when the
    session closes (after the last step)."""

    def __init__(self, features, accuracy, test, weights):
        self.features, self.accuracy, self.test, self.weights = features, accuracy, test, weights

    def end(self, session):
        acc = session.run(self.accuracy, {self.features[0]: self.test[0],
                                          self.features[1]: self.test[1]})
        print("rank %d test accuracy: %.4f" % (hvd.rank(), acc), flush=True)
        report_weights(hvd.rank(), session.run(self.weights))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--checkpoint-dir", default="train_dir")
    args = parser.parse_args()

    hvd.init()
    (x_train, y_train), (x_test, y_test) = digits()
    x_train, y_train = rank_share((x_train.reshape(-1, 64), y_train), hvd.rank(), hvd.size())
    test = (x_test.reshape(-1, 64), y_test)

    images = tf.placeholder(tf.float32, [None, 64], name="images")
    labels = tf.placeholder(tf.int64, [None], name="labels")
    w1 = tf.get_variable("w1", [64, 64], initializer=tf.glorot_uniform_initializer())
    b1 = tf.get_variable("b1", [64], initializer=tf.zeros_initializer())
    w2 = tf.get_variable("w2", [64, 10], initializer=tf.glorot_uniform_initializer())
    b2 = tf.get_variable("b2", [10], initializer=tf.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(images, w1) + b1), w2) + b2
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))

    global_step = tf.train.get_or_create_global_step()
    opt = hvd.DistributedOptimizer(tf.train.AdamOptimizer(args.lr * hvd.size()))
    train_op = opt.minimize(loss, global_step=global_step)

    hooks = [
        hvd.BroadcastGlobalVariablesHook(0),
        tf.train.StopAtStepHook(last_step=args.steps),
        ReportAtEnd((images, labels), accuracy, test, [w1, b1, w2, b2]),
    ]
    rng = np.random.default_rng(hvd.rank())
    with tf.train.MonitoredTrainingSession(
            checkpoint_dir=args.checkpoint_dir if hvd.rank() == 0 else None,
            hooks=hooks, save_summaries_steps=None, save_summaries_secs=None) as session:
        while not session.should_stop():
            pick = rng.choice(len(x_train), args.batch_size, replace=False)
            _, value, step = session.run([train_op, loss, global_step],
                                         {images: x_train[pick], labels: y_train[pick]})
            if hvd.rank() == 0 and (step % args.log_every == 1 or step == args.steps):
                print("global step %d: loss %.4f" % (step, value), flush=True)


if __name__ == "__main__":
    main()
