"""A small, deterministic data-parallel training job for the integration tests.

Every rank trains a two-layer network on its shard of a fixed synthetic data
set with ``DistributedGradientTape``.  Rank 0 prints one line
``RESULT {json}`` with the loss of every step and a digest of the final
weights, so two runs (one host, two hosts) can be compared exactly.

Fault injection: ``--fail-rank R --fail-step S --fail-mode MODE`` makes rank R
do MODE before step S:
  raise   raise RuntimeError
  kill    SIGKILL itself
  exit    leave with os._exit(3) (no clean-up, like a crash)
  hang    sleep for an hour (a stuck rank: other ranks stall)
  pause   sleep --pause-seconds, then go on (a slow rank)
  skip    skip the step's collectives (ranks disagree: a stall)
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--fail-mode", default="raise",
                   choices=["raise", "kill", "exit", "hang", "pause", "skip"])
    p.add_argument("--pause-seconds", type=float, default=3.0)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds each step sleeps (to make a job long enough to hit)")
    p.add_argument("--timeline", default="",
                   help="call hvd.start_timeline(PATH) on every rank after init")
    p.add_argument("--mark-cycles", action="store_true")
    p.add_argument("--payload-kb", type=int, default=0,
                   help="allreduce this many KB once more at the end (traffic to measure)")
    a = p.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if a.timeline:
        hvd.start_timeline(a.timeline, mark_cycles=a.mark_cycles)

    rng = np.random.default_rng(7)
    n = a.batch * size * a.steps
    x_all = rng.normal(size=(n, 8))
    y_all = np.sin(x_all @ rng.normal(size=(8, 1)))
    w1 = tf.Variable(rng.normal(size=(8, 16)) * 0.3, name="w1")
    b1 = tf.Variable(np.zeros(16), name="b1")
    w2 = tf.Variable(rng.normal(size=(16, 1)) * 0.3, name="w2")
    variables = [w1, b1, w2]
    hvd.broadcast_variables(variables, root_rank=0)

    losses = []
    for step in range(a.steps):
        if rank == a.fail_rank and step == a.fail_step:
            print("rank %d: injecting '%s' at step %d" % (rank, a.fail_mode, step), flush=True)
            if a.fail_mode == "raise":
                raise RuntimeError("injected failure on rank %d at step %d" % (rank, step))
            if a.fail_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if a.fail_mode == "exit":
                os._exit(3)
            if a.fail_mode == "hang":
                time.sleep(3600)
            if a.fail_mode == "pause":
                time.sleep(a.pause_seconds)
            if a.fail_mode == "skip":
                continue
        # Global batch `step`, split by rank: the same data whatever the layout.
        lo = (step * size + rank) * a.batch
        xb, yb = x_all[lo:lo + a.batch], y_all[lo:lo + a.batch]
        with tf.GradientTape() as tape:
            h = tf.tanh(xb @ w1 + b1)
            loss = tf.reduce_mean((h @ w2 - yb) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.1 * g)
        losses.append(float(hvd.allreduce(loss, name="loss_%d" % step).numpy()))
        if a.step_sleep:
            time.sleep(a.step_sleep)

    if a.payload_kb:
        hvd.allreduce(tf.ones([a.payload_kb * 128], tf.float64), name="payload")
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in variables)).hexdigest()
    digests = hvd.allgather_object(digest)
    hosts = hvd.allgather_object(os.uname()[1])
    probes = hvd.allgather_object(os.environ.get("TRAIN_PROBE"))
    topology = hvd.allgather_object({
        "rank": rank, "host": os.uname()[1], "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(), "homogeneous": hvd.is_homogeneous()})
    if rank == 0:
        print("RESULT " + json.dumps({"size": size, "losses": losses, "digest": digest,
                                      "ranks_agree": len(set(digests)) == 1,
                                      "hosts": sorted(set(hosts)), "probes": probes,
                                      "topology": topology}),
              flush=True)
    if a.timeline:
        hvd.stop_timeline()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
