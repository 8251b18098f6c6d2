"""Every collective on GPU tensors, compared with the same collective on CPU
tensors (the MPI path), in one process or under mpirun (one GPU per rank)."""

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

GPU = "/GPU:0"
CPU = "/CPU:0"
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
DTYPES = [tf.float32, tf.float16, tf.bfloat16, tf.float64, tf.int32, tf.int64, tf.uint8]


def value(rank, shape=(5, 3)):
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) % 3 + 1 + rank).astype(np.float64)


def on(device, fn, *args):
    """Runs fn with its inputs copied to ``device``; returns numpy results."""
    with tf.device(device):
        args = [tf.identity(a) for a in args]
        out = fn(*args)
    return out


def assert_same(gpu_out, cpu_out, dtype):
    tol = {tf.float16: 1e-2, tf.bfloat16: 4e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(np.asarray(gpu_out, np.float64), np.asarray(cpu_out, np.float64),
                               rtol=tol, atol=tol)


def on_gpu(t):
    # An int32 result may be handed back in host memory (TF decides per
    # executor); every other dtype must stay on the GPU.
    return t.dtype == tf.int32 or "GPU" in t.device


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_allreduce(dtype, op, mode):
    x = tf.constant(value(hvd.rank()), dtype=dtype)
    fn = lambda t: hvd.allreduce(t, op=OPS[op], name="gpu_ar_%s_%s" % (dtype.name, op))  # noqa: E731
    if mode == "function":
        fn = tf.function(fn)
    g = on(GPU, fn, x)
    c = on(CPU, fn, x)
    assert on_gpu(g) and g.dtype == dtype and g.shape == x.shape
    assert_same(g, c, dtype)


def test_allreduce_scaled():
    x = tf.constant(value(hvd.rank()), dtype=tf.float32)
    fn = lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)  # noqa
    assert_same(on(GPU, fn, x), on(CPU, fn, x), tf.float32)


def test_grouped_allreduce_fuses():
    xs = [tf.constant(value(hvd.rank(), (n, 2)), tf.float32) for n in (1, 7, 100, 3)]
    fn = lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Average)  # noqa: E731
    for g, c in zip(on(GPU, fn, *xs), on(CPU, fn, *xs)):
        assert on_gpu(g)
        assert_same(g, c, tf.float32)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.int64, tf.bool], ids=lambda d: d.name)
def test_allgather_uneven(dtype):
    x = tf.cast(tf.constant(value(hvd.rank(), (hvd.rank() + 1, 3))), dtype)
    fn = lambda t: hvd.allgather(t, name="gpu_ag_" + dtype.name)  # noqa: E731
    g, c = on(GPU, fn, x), on(CPU, fn, x)
    assert g.shape[0] == sum(r + 1 for r in range(hvd.size()))
    assert_same(tf.cast(g, tf.float64), tf.cast(c, tf.float64), dtype)


def test_grouped_allgather():
    xs = [tf.constant(value(hvd.rank(), (hvd.rank() + n, 2)), tf.float32) for n in (1, 2)]
    fn = lambda *ts: hvd.grouped_allgather(list(ts))  # noqa: E731
    for g, c in zip(on(GPU, fn, *xs), on(CPU, fn, *xs)):
        assert_same(g, c, tf.float32)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int64, tf.uint8],
                         ids=lambda d: d.name)
def test_broadcast(dtype):
    root = hvd.size() - 1
    x = tf.constant(value(hvd.rank()), dtype=dtype)
    fn = lambda t: hvd.broadcast(t, root_rank=root, name="gpu_bc_" + dtype.name)  # noqa: E731
    g = on(GPU, fn, x)
    assert on_gpu(g)
    assert_same(g, value(root), dtype)


def test_alltoall_with_splits():
    size, rank = hvd.size(), hvd.rank()
    splits = [(rank + j) % 3 for j in range(size)]
    x = tf.constant(value(rank, (sum(splits), 4)), tf.float32)
    fn = lambda t: hvd.alltoall(t, splits=tf.constant(splits, tf.int32))  # noqa: E731
    (g, gs), (c, cs) = on(GPU, fn, x), on(CPU, fn, x)
    assert on_gpu(g)
    np.testing.assert_array_equal(gs.numpy(), cs.numpy())
    assert_same(g, c, tf.float32)


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_uneven(op):
    x = tf.constant(value(hvd.rank(), (2 * hvd.size() + 1, 3)), tf.float32)
    fn = lambda t: hvd.reducescatter(t, op=OPS[op], name="gpu_rs_" + op)  # noqa: E731
    g, c = on(GPU, fn, x), on(CPU, fn, x)
    assert on_gpu(g) and g.shape == c.shape
    assert_same(g, c, tf.float32)


def test_grouped_reducescatter():
    xs = [tf.constant(value(hvd.rank(), (hvd.size() * n, 2)), tf.float32) for n in (1, 3)]
    fn = lambda *ts: hvd.grouped_reducescatter(list(ts), op=hvd.Sum)  # noqa: E731
    for g, c in zip(on(GPU, fn, *xs), on(CPU, fn, *xs)):
        assert_same(g, c, tf.float32)


def test_gradient_tape_on_gpu():
    with tf.device(GPU):
        w = tf.Variable(tf.ones((4, 2)))
        x = tf.constant(value(hvd.rank(), (3, 4)), tf.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, w))
        tape = hvd.DistributedGradientTape(tape)
        (grad,) = tape.gradient(loss, [w])
    want = np.mean([value(r, (3, 4)).sum(0) for r in range(hvd.size())], axis=0)
    assert_same(grad, np.repeat(want[:, None], 2, axis=1), tf.float32)


def test_int16_allreduce_on_gpu_is_a_clear_error():
    # int16 reduces on the CPU (tests/parallel/test_small_int_sums.py); NCCL
    # has no 16-bit integers, so on the GPU every rank gets the NCCL
    # backend's clear error, together (no rank hangs).
    x = tf.constant(value(hvd.rank()), tf.int16)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NCCL cannot reduce int16"):
        on(GPU, lambda t: hvd.allreduce(t, op=hvd.Sum, name="gpu_int16"), x)


def test_mixed_cpu_and_gpu_tensors_across_ranks():
    if hvd.size() < 2:
        pytest.skip("needs two ranks: run under mpirun -np 2 or more")
    x = tf.constant(value(hvd.rank()), tf.float32)
    device = CPU if hvd.rank() == 0 else GPU
    with pytest.raises(tf.errors.FailedPreconditionError, match="mixed CPU and GPU tensors"):
        on(device, lambda t: hvd.allreduce(t, name="gpu_mixed"), x)
