"""Ranks that disagree get a clear error on every rank; the runtime keeps working."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd


def expect_error_everywhere(fn, *fragments):
    """Runs fn on every rank; each rank must raise an error naming all fragments."""
    start = time.monotonic()
    with pytest.raises(tf.errors.FailedPreconditionError) as info:  # Horovod's class
        fn()
    assert time.monotonic() - start < 10
    for frag in fragments:
        assert frag in info.value.message, info.value.message
    # The runtime still works afterwards.
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="ok").numpy() == hvd.size()
    return info.value.message


def test_shape_mismatch():
    r = hvd.rank()
    msg = expect_error_everywhere(
        lambda: hvd.allreduce(tf.ones([r + 1]), name="grad_w"),
        "'grad_w'", "mismatched shapes", "rank 0 sent shape [1]", "rank 1 sent shape [2]")
    assert "allreduce" in msg


def test_dtype_mismatch():
    dt = tf.float32 if hvd.rank() == 0 else tf.float64
    expect_error_everywhere(lambda: hvd.allreduce(tf.ones([2], dt), name="mixed"),
                            "'mixed'", "mismatched dtypes", "rank 0 sent float32",
                            "float64")


def test_reduce_op_mismatch():
    op = hvd.Sum if hvd.rank() == 0 else hvd.Max
    expect_error_everywhere(lambda: hvd.allreduce(tf.ones([2]), op=op, name="ops"),
                            "mismatched reduce ops", "rank 0 sent Sum", "sent Max")


def test_scale_factor_mismatch():
    f = 1.0 if hvd.rank() == 0 else 2.0
    expect_error_everywhere(lambda: hvd.allreduce(tf.ones([2]), prescale_factor=f, name="sc"),
                            "mismatched scale factors")


def test_root_rank_mismatch():
    root = 0 if hvd.rank() == 0 else 1
    expect_error_everywhere(lambda: hvd.broadcast(tf.ones([2]), root, name="bc_root"),
                            "'bc_root'", "mismatched root ranks", "rank 0 sent root 0",
                            "sent root 1")


def test_collective_mismatch():
    def fn():
        if hvd.rank() == 0:
            return hvd.allgather(tf.ones([2]), name="same_name")
        return hvd.broadcast(tf.ones([2]), 0, name="same_name")

    expect_error_everywhere(fn, "'same_name'", "different collectives",
                            "rank 0 sent allgather", "sent broadcast")


def test_allgather_trailing_dims_mismatch():
    r = hvd.rank()
    expect_error_everywhere(lambda: hvd.allgather(tf.ones([2, r + 2]), name="ag_bad"),
                            "'ag_bad'", "all dimensions but the first must match",
                            "rank 0 sent shape [2, 2]")


def test_alltoall_bad_splits_on_one_rank():
    size = hvd.size()
    splits = [1] * size
    if hvd.rank() == size - 1:
        splits = [2] * size  # sums to 2*size, but the tensor has size rows
    expect_error_everywhere(
        lambda: hvd.alltoall(tf.ones([size]), splits=splits, name="a2a_bad"),
        "'a2a_bad'", "rank %d gave splits" % (size - 1), "first dimension is %d" % size)


def test_reducescatter_shape_mismatch():
    r = hvd.rank()
    expect_error_everywhere(lambda: hvd.reducescatter(tf.ones([4 + r]), name="rs_bad"),
                            "'rs_bad'", "mismatched shapes")


def test_graph_mode_mismatch_then_success():
    r = hvd.rank()

    @tf.function
    def step(x):
        return hvd.allreduce(x, name="fn_grad")

    with pytest.raises(tf.errors.FailedPreconditionError, match="fn_grad"):
        step(tf.ones([r + 1]))
    np.testing.assert_allclose(step(tf.ones([3])).numpy(), np.ones(3))
