"""An elastic Keras ``fit`` whose world grows and then loses its first host,
for test_elastic_slots.py.

Every batch is committed (``CommitStateCallback``).  Rank 0 logs each commit
to ``LOG_DIR/commits.jsonl`` (``{"ev": "commit", "n", "size"}``), which the
discovery script (elastic_discover.py) reads to switch hosts at known
commits.  ``--hold N:SIZE`` keeps the job at commit ``N`` while the world has
``SIZE`` workers until the host change interrupts it, so the change lands at
that commit however slow the machine is.  Each worker logs ``done`` with its
final weights.

The survivors trace their train step while alone on their host: the step
must still reduce once newcomers join (the deadlock this program guards).
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow.keras as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hold", action="append", default=[],
                        help="N:SIZE: wait at commit N while the world has SIZE workers")
    parser.add_argument("--hold-timeout", type=float, default=90.0)
    parser.add_argument("--diverge-rank", type=int, default=-1,
                        help="this rank runs an extra allreduce first (a bug to report)")
    args = parser.parse_args()
    holds = {tuple(int(v) for v in h.split(":")) for h in args.hold}

    hvd.init()
    worker = os.environ.get("TFHVD_ELASTIC_WORKER", "solo:0")  # host:slot, set by the driver
    rng = np.random.default_rng(7)
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1))).astype("float32")

    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)))
    # No collective before hvd.elastic.run: a newcomer's would have no match.
    model.build((None, 8))

    class State(hvd.elastic.KerasState):
        def commit(self) -> None:
            self.commits += 1
            if hvd.rank() == 0:
                with open(os.path.join(args.log_dir, "commits.jsonl"), "a") as f:
                    f.write(json.dumps({"ev": "commit", "n": self.commits, "size": hvd.size(),
                                        "t": time.time()}) + "\n")
            self.save()
            if (self.commits, hvd.size()) in holds:
                deadline = time.monotonic() + args.hold_timeout
                while time.monotonic() < deadline:  # every rank polls alike
                    self.check_host_updates()
                    time.sleep(0.5)
                raise RuntimeError("the hosts never changed at commit %d" % self.commits)
            self.check_host_updates()

    state = State(model, batch=0, epoch=0, commits=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == args.diverge_rank:
            hvd.allreduce(tf.ones([3]), name="extra_allreduce_on_one_rank")
        shard = np.arange(hvd.rank(), len(x), hvd.size())
        data = tf.data.Dataset.from_tensor_slices((x[shard], y[shard])).repeat().batch(8)
        while state.epoch < args.epochs:  # one fit an epoch: resume mid-epoch exactly
            state.model.fit(data, steps_per_epoch=args.steps - state.batch, epochs=1,
                            callbacks=callbacks, verbose=0)

    train(state)
    weights = [float(v) for w in model.get_weights() for v in np.ravel(w)]
    with open(os.path.join(args.log_dir, "%s.jsonl" % worker), "a") as f:
        f.write(json.dumps({"ev": "done", "worker": worker, "rank": hvd.rank(),
                            "size": hvd.size(), "epoch": int(state.epoch),
                            "commits": int(state.commits), "weights": weights}) + "\n")


if __name__ == "__main__":
    main()
