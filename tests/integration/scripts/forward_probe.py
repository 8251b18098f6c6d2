"""Whether a graph-mode allreduce or broadcast reuses its input's buffer.

Run under ``TF_CPU_ALLOCATOR_USE_BFC=true`` (TensorFlow then counts CPU
allocations): inside a ``tf.function``, a 4 MiB tensor that only the collective
consumes should be forwarded to the collective's output, so the call's peak
allocation grows by one tensor, not two.  A tensor that the function also
returns must not be forwarded: it keeps its values.  Rank 0 prints one
``RESULT {...}`` line.
"""

import json
import time

import tensorflow as tf

import tfhvd.tensorflow as hvd

N = 1 << 20  # float32 elements: 4 MiB


def peak_growth(fn, *args) -> int:
    """Bytes the call's peak allocation rose above what was live before it.

    (After a short pause: a previous call's intermediates may be freed after
    it returned, which would hide as much of this call's growth.)"""
    time.sleep(0.05)
    tf.config.experimental.reset_memory_stats("CPU:0")
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    out = fn(*args)
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    del out
    return peak - before


def main() -> None:
    hvd.init()
    size = hvd.size()
    t = tf.fill([N], float(hvd.rank() + 1))
    total = float(sum(range(1, size + 1)))

    @tf.function
    def allreduce_only(t):
        return hvd.allreduce(t * 2.0, op=hvd.Sum, name="fwd_sum")

    @tf.function
    def average_only(t):
        return hvd.allreduce(t * 2.0, op=hvd.Average, name="fwd_avg")

    @tf.function
    def broadcast_only(t):
        return hvd.broadcast(t * 2.0, root_rank=0, name="fwd_bcast")

    @tf.function
    def allreduce_kept(t):
        x = t * 2.0
        return hvd.allreduce(x, op=hvd.Sum, name="fwd_kept"), x

    result = {}
    for name, fn, want in (("sum", allreduce_only, 2.0 * total),
                           ("average", average_only, 2.0 * total / size),
                           ("broadcast", broadcast_only, 2.0)):
        for _ in range(2):  # trace, warm up
            y = fn(t)
        assert abs(float(y[0]) - want) < 1e-5 and abs(float(y[-1]) - want) < 1e-5, (name, y)
        result[name] = max(peak_growth(fn, t) for _ in range(5))
    y, x = allreduce_kept(t)
    own = 2.0 * (hvd.rank() + 1)
    assert abs(float(x[0]) - own) < 1e-6 and abs(float(x[-1]) - own) < 1e-6, x
    assert abs(float(y[0]) - 2.0 * total) < 1e-5, y
    result["kept"] = max(peak_growth(allreduce_kept, t) for _ in range(5))
    result["tensor_bytes"] = N * 4
    worst = hvd.allgather_object(result)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps({k: max(r[k] for r in worst) for k in result}), flush=True)


if __name__ == "__main__":
    main()
