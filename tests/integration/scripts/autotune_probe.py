"""A job for the autotune tests (docs/autotune.md): every step allreduces
eight gradients-like tensors in a ``tf.function`` (so they can fuse) and
checks the sums, while autotune changes the fusion threshold, cycle time and
response cache under it.  Rank 0 prints ``RESULT {json}`` with every rank's
``autotune_state()`` (what it applied, in order) and the steps it ran.
"""

import argparse
import json

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.common import basics


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--elements", type=int, default=16 * 1024)
    args = p.parse_args()
    hvd.init()
    size = hvd.size()
    xs = [tf.fill([args.elements], float(hvd.rank() + i)) for i in range(args.tensors)]

    @tf.function
    def step(values):
        return [hvd.allreduce(v, op=hvd.Sum, name="grad_%d" % i) for i, v in enumerate(values)]

    for s in range(args.steps):
        outs = step(xs)
        for i, o in enumerate(outs):
            want = sum(r + i for r in range(size))
            got = o.numpy()
            if not np.all(got == want):
                raise AssertionError("step %d tensor %d: got %s, want %s under %s"
                                     % (s, i, got[:3], want, basics.autotune_state()))
    states = hvd.allgather_object(basics.autotune_state(), name="autotune_states")
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({"states": states, "steps": args.steps}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
