"""Every collective on every dtype, eagerly and in tf.function, on N ranks."""

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
                 tf.float64]
ALL_DTYPES = REDUCE_DTYPES + [tf.bool]
OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
MODES = ["eager", "function"]


def rank_size():
    return hvd.rank(), hvd.size()


def run(mode, fn, *args):
    """Runs fn eagerly or inside a fresh tf.function."""
    if mode == "eager":
        return fn(*args)
    return tf.function(fn, autograph=False)(*args)


def value(rank, shape=(3, 2)):
    """Small positive values that depend on the rank, exact in every dtype."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) % 3 + 1 + rank).astype(np.float64)


def expected_reduce(op, size, shape=(3, 2)):
    vals = np.stack([value(r, shape) for r in range(size)])
    return {"Sum": vals.sum(0), "Average": vals.sum(0) / size, "Min": vals.min(0),
            "Max": vals.max(0), "Product": vals.prod(0)}[op]


def close(got, want, dtype):
    got = np.asarray(got, dtype=np.float64)
    if dtype.is_integer:
        want = np.trunc(want)  # integer averages truncate, as in Horovod
    tol = {tf.float16: 1e-2, tf.bfloat16: 4e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=lambda d: d.name)
def test_allreduce(dtype, op, mode):
    rank, size = rank_size()
    if op == "Product" and dtype in (tf.uint8, tf.int8, tf.float16, tf.bfloat16) and size > 2:
        pass  # values stay small enough: max 6**3 fits float16; int8 may wrap, skip compare
    x = tf.constant(value(rank), dtype=dtype)
    out = run(mode, lambda t: hvd.allreduce(t, op=OPS[op], name="ar"), x)
    assert out.dtype == dtype and out.shape == x.shape
    want = expected_reduce(op, size)
    if dtype in (tf.uint8, tf.int8) and want.max() > dtype.max:
        return
    close(out.numpy(), want, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scale_factors(mode):
    rank, size = rank_size()
    x = tf.constant(value(rank), tf.float32)
    out = run(mode, lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5,
                                            postscale_factor=3.0), x)
    close(out.numpy(), expected_reduce("Sum", size) * 1.5, tf.float32)
    out = run(mode, lambda t: hvd.allreduce(t, op=hvd.Average, prescale_factor=2.0), x)
    close(out.numpy(), expected_reduce("Average", size) * 2.0, tf.float32)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes(mode):
    rank, size = rank_size()
    xs = [tf.constant(value(rank, (2,)), tf.float32), tf.constant(value(rank, (4, 1)), tf.int64),
          tf.constant(value(rank, (3,)), tf.float64)]
    outs = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Sum), *xs)
    for x, o, shape in zip(xs, outs, [(2,), (4, 1), (3,)]):
        assert o.dtype == x.dtype
        close(o.numpy(), expected_reduce("Sum", size, shape), x.dtype)


@pytest.mark.parametrize("mode", MODES)
def test_fusion_of_many_tensors(mode):
    rank, size = rank_size()

    def many(base):
        return [hvd.allreduce(base * (i + 1), op=hvd.Sum, name="many_%d" % i) for i in range(64)]

    outs = run(mode, many, tf.fill([257], float(rank + 1)))
    total = sum(range(1, size + 1))
    for i, o in enumerate(outs):
        np.testing.assert_allclose(o.numpy(), np.full([257], total * (i + 1.0)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_allgather_uneven_first_dim(dtype, mode):
    rank, size = rank_size()
    x = tf.cast(tf.fill([rank + 1, 2], rank + 1), dtype)
    out = run(mode, lambda t: hvd.allgather(t, name="ag"), x)
    want = np.concatenate([np.full([r + 1, 2], r + 1) for r in range(size)])
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy().astype(np.float64),
                                  want.astype(bool) if dtype == tf.bool else want)


def test_allgather_scalar_and_grouped():
    rank, size = rank_size()
    np.testing.assert_array_equal(hvd.allgather(tf.constant(rank * 2)).numpy(),
                                  [2 * r for r in range(size)])
    a, b = hvd.grouped_allgather([tf.fill([rank + 1], rank), tf.fill([1, 3], rank)])
    assert a.shape == (size * (size + 1) // 2,) and b.shape == (size, 3)
    np.testing.assert_array_equal(b.numpy()[:, 0], np.arange(size))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_broadcast_every_root(dtype, mode):
    rank, size = rank_size()
    for root in range(size):
        x = tf.cast(tf.fill([2, 3], rank + 1), dtype)
        out = run(mode, lambda t: hvd.broadcast(t, root, name="bc"), x)
        want = np.full([2, 3], root + 1).astype(np.float64)
        np.testing.assert_array_equal(out.numpy().astype(np.float64),
                                      want.astype(bool) if dtype == tf.bool else want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_alltoall_with_splits(dtype, mode):
    rank, size = rank_size()
    # Rank r sends j + 1 rows to rank j, each row filled with r + 1.
    splits = [j + 1 for j in range(size)]
    x = tf.cast(tf.fill([sum(splits), 2], rank + 1), dtype)
    out, rsplits = run(mode, lambda t: hvd.alltoall(t, splits=splits, name="a2a"), x)
    assert rsplits.numpy().tolist() == [rank + 1] * size
    want = np.concatenate([np.full([rank + 1, 2], r + 1) for r in range(size)]).astype(np.float64)
    np.testing.assert_array_equal(out.numpy().astype(np.float64),
                                  want.astype(bool) if dtype == tf.bool else want)


def test_alltoall_even_split_and_zero_splits():
    rank, size = rank_size()
    out = hvd.alltoall(tf.fill([size * 2], rank))
    np.testing.assert_array_equal(out.numpy(), np.repeat(np.arange(size), 2))
    # Rank 0 sends nothing to anyone.
    splits = [0] * size if rank == 0 else [1] * size
    out, rs = hvd.alltoall(tf.fill([sum(splits)], rank), splits=splits)
    assert rs.numpy().tolist() == [0] + [1] * (size - 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", REDUCE_DTYPES, ids=lambda d: d.name)
def test_reducescatter_uneven(dtype, mode):
    rank, size = rank_size()
    rows = 2 * size + 1  # the first rank gets one row more
    x = tf.constant(value(rank, (rows, 2)), dtype)
    out = run(mode, lambda t: hvd.reducescatter(t, op=hvd.Sum, name="rs"), x)
    full = expected_reduce("Sum", size, (rows, 2))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    if dtype in (tf.uint8, tf.int8) and full.max() > dtype.max:
        return
    close(out.numpy(), full[start:start + counts[rank]], dtype)
    avg = run(mode, lambda t: hvd.reducescatter(t, name="rs_avg"), tf.constant(value(rank, (rows, 2)), tf.float32))
    close(avg.numpy(), full[start:start + counts[rank]] / size, tf.float32)


def test_grouped_reducescatter():
    rank, size = rank_size()
    a, b = hvd.grouped_reducescatter([tf.ones([size, 2]) * (rank + 1), tf.ones([size * 3])],
                                     op=hvd.Sum)
    total = size * (size + 1) / 2
    np.testing.assert_array_equal(a.numpy(), np.full([1, 2], total))
    np.testing.assert_array_equal(b.numpy(), np.full([3], float(size)))


def test_join_contributes_zeros():
    rank, size = rank_size()
    if rank == 0:
        last = hvd.join()  # rank 0 has no more data
    else:
        out = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum, name="after_join")
        # Rank 0 contributed zeros.
        assert out.numpy()[0] == sum(range(1, size))
        last = hvd.join()
    assert 0 <= last < size
    # Everything is back to normal after all ranks joined.
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy() == size


def test_barrier():
    hvd.barrier()
    hvd.barrier()


def test_object_collectives():
    rank, size = rank_size()
    obj = hvd.broadcast_object({"from": rank, "data": list(range(rank + 3))}, root_rank=size - 1)
    assert obj == {"from": size - 1, "data": list(range(size + 2))}
    objs = hvd.allgather_object(("rank", rank, "x" * rank))
    assert objs == [("rank", r, "x" * r) for r in range(size)]


def test_broadcast_variables():
    rank, size = rank_size()
    v = [tf.Variable(tf.fill([3], float(rank))), tf.Variable(rank * 10)]
    hvd.broadcast_variables(v, root_rank=size - 1)
    assert v[0].numpy().tolist() == [size - 1.0] * 3 and int(v[1].numpy()) == (size - 1) * 10


def test_empty_tensors():
    rank, size = rank_size()
    assert hvd.allreduce(tf.zeros([0, 4]), name="e_ar").shape == (0, 4)
    g = hvd.allgather(tf.ones([rank % 2, 3]), name="e_ag")  # some ranks send no rows
    assert g.shape == (sum(r % 2 for r in range(size)), 3)
    assert hvd.broadcast(tf.zeros([0]), 0, name="e_bc").shape == (0,)
    out, rs = hvd.alltoall(tf.zeros([0, 2]), splits=[0] * size, name="e_a2a")
    assert out.shape == (0, 2) and rs.numpy().tolist() == [0] * size
    assert hvd.reducescatter(tf.zeros([0, 2]), name="e_rs").shape == (0, 2)


def test_eager_threads_and_a_graph_at_once():
    """An eager op runs the runtime on its own thread until it is done; other
    threads' eager ops and a tf.function's ops (the background thread's work)
    run meanwhile, submitted in the opposite order on odd ranks, and under a
    name that two threads use at once."""
    import threading

    rank, size = rank_size()
    n = 8
    results = {}
    errors = []

    def eager(i, name):
        try:
            x = tf.fill([3], float(i))
            results[(i, name)] = hvd.allreduce(x, op=hvd.Sum, name=name).numpy()
        except Exception as e:  # reported below, on every rank
            errors.append(repr(e))

    @tf.function
    def graph(t):
        return [hvd.allreduce(t * float(i), op=hvd.Sum, name="conc_graph_%d" % i)
                for i in range(4)]

    order = list(range(n)) if rank % 2 == 0 else list(reversed(range(n)))
    threads = [threading.Thread(target=eager, args=(i, "conc_eager_%d" % i)) for i in order]
    threads += [threading.Thread(target=eager, args=(1, "conc_same")) for _ in range(2)]
    for t in threads:
        t.start()
    graph_out = graph(tf.ones([2]))
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "an eager thread never finished"
    assert not errors, errors
    for i in range(n):
        assert results[(i, "conc_eager_%d" % i)].tolist() == [float(i * size)] * 3
    assert results[(1, "conc_same")].tolist() == [float(size)] * 3
    assert [g.numpy().tolist() for g in graph_out] == [[float(i * size)] * 2 for i in range(4)]
