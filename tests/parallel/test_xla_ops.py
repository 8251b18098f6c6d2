"""tfhvd allreduces inside the user's own ``tf.function(jit_compile=True)``, across
ranks: XLA custom calls into the runtime (tfhvd_ops/tensorflow/xla_ops.cc).

Size-agnostic: run under ``mpirun -np 2`` and ``-np 3``.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow.xla import xla_ops_refusal

hvd.init()


def _values(n: int, rank: int) -> np.ndarray:
    return np.arange(n, dtype=np.float32) * (rank + 1) - rank


def _all_ranks(n: int) -> np.ndarray:
    return np.stack([_values(n, r) for r in range(hvd.size())])


def test_allreduce_and_grouped_allreduce_across_ranks():
    assert xla_ops_refusal() is None, xla_ops_refusal()

    @tf.function(jit_compile=True)
    def step(x, y):
        s = hvd.allreduce(x * 2.0, op=hvd.Sum, name="xla_sum")
        a, b = hvd.grouped_allreduce([x, y], op=hvd.Average, name="xla_group")
        return tf.reduce_sum(s) + 0.0, s, a, b

    r = hvd.rank()
    x = tf.constant(_values(5, r))
    y = tf.constant(_values(7, r) + 1.0)
    for _ in range(3):  # the same names step after step (the response cache)
        total, s, a, b = step(x, y)
        np.testing.assert_allclose(s.numpy(), 2 * _all_ranks(5).sum(0), rtol=1e-6)
        np.testing.assert_allclose(total.numpy(), 2 * _all_ranks(5).sum(), rtol=1e-6)
        np.testing.assert_allclose(a.numpy(), _all_ranks(5).mean(0), rtol=1e-6)
        np.testing.assert_allclose(b.numpy(), (_all_ranks(7) + 1.0).mean(0), rtol=1e-6)
    hlo = step.experimental_get_compiler_ir(x, y)(stage="hlo")
    assert hlo.count('custom_call_target="tfhvd_allreduce"') == 2, hlo


def test_xla_and_plain_collectives_interleave():
    @tf.function(jit_compile=True)
    def compiled(x):
        return hvd.allreduce(x, op=hvd.Max, name="xla_max")

    r = hvd.rank()
    for i in range(3):
        x = tf.constant([float(r + i), -float(r)])
        got = compiled(x).numpy()
        plain = hvd.allreduce(x, op=hvd.Min, name="eager_min_%d" % i).numpy()
        np.testing.assert_allclose(got, [hvd.size() - 1 + i, 0.0])
        np.testing.assert_allclose(plain, [float(i), -(hvd.size() - 1.0)])


def test_a_shape_that_differs_between_ranks_is_a_clear_error():
    """Under XLA as outside it: every rank fails, naming the tensor, not a hang."""

    @tf.function(jit_compile=True)
    def uneven(x):
        return hvd.allreduce(x, name="xla_uneven")

    with pytest.raises(tf.errors.OpError) as excinfo:
        uneven(tf.ones([2 + hvd.rank()]))
    message = str(excinfo.value)
    assert "xla_uneven" in message and "shape" in message.lower(), message
    # The runtime still works afterwards.
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after").numpy(),
                               [hvd.size()] * 2)


def test_a_process_set_under_xla():
    # Dynamic mode: settings are read at init, which other modules did already.
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    evens = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    try:
        @tf.function(jit_compile=True)
        def in_set(x):
            return hvd.allreduce(x, op=hvd.Sum, name="xla_evens", process_set=evens)

        if evens.included():
            got = in_set(tf.constant([1.0 + hvd.rank()])).numpy()
            assert got.tolist() == [sum(1.0 + r for r in range(0, hvd.size(), 2))]
    finally:
        hvd.remove_process_set(evens)
