"""Every registered gradient gives Horovod's value (horovod/tensorflow/mpi_ops.py).

Each test makes rank r's upstream gradient a known function of r, so every rank
can compute, with numpy, what Horovod's gradient formula gives, and compares the
gradient tfhvd computes (eagerly and inside a tf.function) against it.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

MODES = ["eager", "function"]


def upstream(rank: int, shape) -> np.ndarray:
    """Rank `rank`'s dL/dy: distinct on every rank and in every element."""
    n = int(np.prod(shape))
    return ((rank + 1.0) * (np.arange(n) % 5 + 1.0) / 4.0).reshape(shape).astype(np.float32)


def upstream_tf(rank: int, y: tf.Tensor) -> tf.Tensor:
    """upstream() for a tensor whose shape may be known only when it runs."""
    n = tf.size(y)
    flat = (rank + 1.0) * (tf.cast(tf.range(n) % 5, tf.float32) + 1.0) / 4.0
    return tf.reshape(flat, tf.shape(y))


def tape_grad(fn, xs, mode):
    """d(sum(fn(xs) * upstream))/dxs, where fn returns a list of outputs."""
    rank = hvd.rank()

    def run(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            ys = fn(*xs)
            loss = tf.add_n([tf.reduce_sum(y * upstream_tf(rank, y)) for y in ys])
        return tape.gradient(loss, list(xs))

    out = tf.function(run)(*xs) if mode == "function" else run(*xs)
    return [g.numpy() for g in out]


def reduce_np(op, stack):
    return {hvd.Sum: np.sum, hvd.Average: np.mean, hvd.Min: np.min, hvd.Max: np.max,
            hvd.Product: np.prod}[op](stack, axis=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,pre,post", [
    (hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 3.0),
    (hvd.Average, 2.0, 0.25), (hvd.Min, 1.0, 1.0), (hvd.Max, 2.0, 1.0),
    (hvd.Product, 1.0, 0.5)])
def test_allreduce_gradient(mode, op, pre, post):
    size = hvd.size()
    shape = (3, 2)
    x = tf.constant(np.full(shape, 1.5, np.float32))
    (g,) = tape_grad(lambda t: [hvd.allreduce(t, op=op, prescale_factor=pre,
                                              postscale_factor=post, name="cv_ar")], [x], mode)
    # Horovod: _allreduce(grad, op=reduce_op, prescale_factor, postscale_factor).
    want = reduce_np(op, np.stack([pre * upstream(r, shape) for r in range(size)])) * post
    np.testing.assert_allclose(g, want, rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,pre,post", [(hvd.Sum, 1.0, 2.0), (hvd.Average, 0.5, 1.0),
                                         (hvd.Max, 1.0, 1.0)])
def test_grouped_allreduce_gradient(mode, op, pre, post):
    size = hvd.size()
    shapes = [(2,), (2, 3)]
    xs = [tf.ones(s) for s in shapes]
    gs = tape_grad(lambda *t: hvd.grouped_allreduce(list(t), op=op, prescale_factor=pre,
                                                    postscale_factor=post, name="cv_gar"),
                   xs, mode)
    for g, s in zip(gs, shapes):
        want = reduce_np(op, np.stack([pre * upstream(r, s) for r in range(size)])) * post
        np.testing.assert_allclose(g, want, rtol=1e-5)


def rows_of(size):
    return [r + 1 for r in range(size)]  # rank r holds r + 1 rows


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("grouped", [False, True])
def test_allgather_gradient(mode, grouped):
    rank, size = hvd.rank(), hvd.size()
    rows = rows_of(size)
    x = tf.ones([rows[rank], 2])
    if grouped:
        (g,) = tape_grad(lambda t: hvd.grouped_allgather([t], name="cv_gag"), [x], mode)
    else:
        (g,) = tape_grad(lambda t: [hvd.allgather(t, name="cv_ag")], [x], mode)
    total = (sum(rows), 2)
    # Horovod: Average-allreduce of the gradient, then this rank's rows.
    mean = np.mean(np.stack([upstream(r, total) for r in range(size)]), axis=0)
    start = sum(rows[:rank])
    np.testing.assert_allclose(g, mean[start:start + rows[rank]], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_gradient(mode, root):
    rank, size = hvd.rank(), hvd.size()
    root = root % size
    (g,) = tape_grad(lambda t: [hvd.broadcast(t, root, name="cv_bc")], [tf.ones([4])], mode)
    mean = np.mean(np.stack([upstream(r, (4,)) for r in range(size)]), axis=0)
    np.testing.assert_allclose(g, mean if rank == root else np.zeros(4), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient(mode):
    rank, size = hvd.rank(), hvd.size()

    def splits_of(r):  # uneven: rank r sends (r + j) % 2 + 1 rows to rank j
        return [(r + j) % 2 + 1 for j in range(size)]

    x = tf.ones([sum(splits_of(rank)), 3])
    (g,) = tape_grad(lambda t: [hvd.alltoall(t, splits=splits_of(rank), name="cv_a2a")[0]],
                     [x], mode)
    # Horovod: alltoall(grad, splits=received_splits): the rows rank r sent to
    # rank j get rank j's upstream gradient at the rows it received from r.
    want = []
    for j in range(size):
        recv = [splits_of(k)[j] for k in range(size)]
        up = upstream(j, (sum(recv), 3))
        start = sum(recv[:rank])
        want.append(up[start:start + recv[rank]])
    np.testing.assert_allclose(g, np.concatenate(want), rtol=1e-6)


def scatter_rows(d, size):
    return [d // size + (1 if k < d % size else 0) for k in range(size)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,pre,post", [
    (hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 4.0),
    (hvd.Average, 2.0, 3.0), (hvd.Max, 1.0, 2.0)])
@pytest.mark.parametrize("grouped", [False, True])
def test_reducescatter_gradient(mode, op, pre, post, grouped):
    size = hvd.size()
    d = 2 * size + 1  # uneven: the first rank gets one row more
    x = tf.ones([d, 2])
    kw = dict(op=op, prescale_factor=pre, postscale_factor=post)
    if grouped:
        (g,) = tape_grad(lambda t: hvd.grouped_reducescatter([t], name="cv_grs", **kw), [x],
                         mode)
    else:
        (g,) = tape_grad(lambda t: [hvd.reducescatter(t, name="cv_rs", **kw)], [x], mode)
    # Horovod: grad *= size for Sum, *= prescale, *= postscale, then allgather.
    factor = pre * post * (size if op == hvd.Sum else 1.0)
    want = np.concatenate([factor * upstream(k, (n, 2))
                           for k, n in enumerate(scatter_rows(d, size))])
    np.testing.assert_allclose(g, want, rtol=1e-5)
