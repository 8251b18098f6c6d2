"""Every collective on every dtype, eagerly and in tf.function, on N ranks."""

import time

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

REDUCE_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
                 tf.float64]
# Broadcast, allgather and alltoall also move bool, int16 and uint16.
ALL_DTYPES = REDUCE_DTYPES + [tf.bool, tf.int16, tf.uint16]
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


def value(rank, shape=(3, 2), op="Sum"):
    """Small positive values that depend on the rank, exact in every dtype.

    For Product, each element is 2 on every third rank and 1 elsewhere, so the
    product stays within int8 (and float16's exact integers) up to 18 ranks;
    the other ops' results fit int8 up to 13 ranks.
    """
    n = int(np.prod(shape))
    idx = np.arange(n).reshape(shape)
    if op == "Product":
        return (1 + ((idx + rank) % 3 == 0)).astype(np.float64)
    return (idx % 3 + 1 + rank).astype(np.float64)


def expected_reduce(op, size, shape=(3, 2)):
    vals = np.stack([value(r, shape, op) for r in range(size)])
    return {"Sum": vals.sum(0), "Average": vals.sum(0) / size, "Min": vals.min(0),
            "Max": vals.max(0), "Product": vals.prod(0)}[op]


def assert_fits(want, dtype):
    """The expected values must be exact in ``dtype``: a size for which they
    overflow fails here instead of passing unchecked."""
    if dtype.is_integer:
        assert dtype.min <= want.min() and want.max() <= dtype.max, \
            "expected %s values overflow %s at %d ranks" % (want.max(), dtype.name, hvd.size())


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
    x = tf.constant(value(rank, op=op), dtype=dtype)
    out = run(mode, lambda t: hvd.allreduce(t, op=OPS[op], name="ar"), x)
    assert out.dtype == dtype and out.shape == x.shape
    want = expected_reduce(op, size)
    assert_fits(want, dtype)
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
    # Rank r gave r + 1 copies of r: [0, 1, 1, 2, 2, 2, ...].
    np.testing.assert_array_equal(a.numpy(), np.repeat(np.arange(size), np.arange(1, size + 1)))
    np.testing.assert_array_equal(b.numpy(), np.repeat(np.arange(size)[:, None], 3, axis=1))


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
    # One element from each of ranks 1..size-1, holding that rank's number.
    np.testing.assert_array_equal(out.numpy(), np.arange(1, size))


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
    assert_fits(full, dtype)
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
    """Rank 0 joins at once; the others reduce with zeros from it; the last rank
    also reduces alone (every other rank joined) and so joins last; every rank
    learns which rank that was, and the job goes on."""
    rank, size = rank_size()
    seen = {}
    if rank == 0:
        seen["last"] = hvd.join()  # rank 0 has no more data
    else:
        x = tf.constant([float(rank), 10.0 * rank])
        seen["sum"] = hvd.allreduce(x, op=hvd.Sum, name="after_join_sum").numpy().tolist()
        seen["avg"] = hvd.allreduce(x, op=hvd.Average, name="after_join_avg").numpy().tolist()
        seen["grouped"] = [t.numpy().tolist() for t in hvd.grouped_allreduce(
            [x, x * 2.0], op=hvd.Sum, name="after_join_grouped")]
        if rank == size - 1:
            # Every other rank has joined (or will): only this rank's values count.
            seen["alone"] = hvd.allreduce(x, op=hvd.Average, name="alone").numpy().tolist()
        seen["last"] = hvd.join()
    # Everything is back to normal after all ranks joined.
    seen["after"] = float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="post_join"))
    seen["bcast"] = hvd.broadcast(tf.constant([rank]), size - 1, name="post_join_bc").numpy()
    seen["again"] = hvd.join()  # a second join with everyone at once still returns a rank

    assert seen["last"] == size - 1, seen
    assert seen["after"] == size and seen["bcast"].tolist() == [size - 1]
    assert 0 <= seen["again"] < size
    if rank > 0:
        # Joined ranks contribute zeros; Average still divides by the job's size
        # (Horovod's rule), so the mean over ranks 1..size-1 comes out of a
        # sum over all ranks.
        total = sum(range(1, size))
        assert seen["sum"] == [total, 10.0 * total], seen
        np.testing.assert_allclose(seen["avg"], [total / size, 10.0 * total / size], rtol=1e-6)
        assert seen["grouped"] == [[total, 10.0 * total], [2.0 * total, 20.0 * total]], seen
    if rank == size - 1:
        np.testing.assert_allclose(seen["alone"], [rank / size, 10.0 * rank / size], rtol=1e-6)


def _barrier_times(enter):
    """The last rank sleeps before ``enter``; returns (its arrival, each rank's exit)."""
    rank, size = rank_size()
    if rank == size - 1:
        time.sleep(0.5)
    arrived = time.time()
    left = enter()
    gathered = hvd.allgather_object((arrived, left), name="barrier_times")
    return gathered[-1][0], [g[1] for g in gathered]


def test_collectives_that_look_alike_on_one_rank_stay_apart_in_tf_function():
    """Rank 0's shard has a static first dimension of 1, so allgather(rows)
    folds to allgather([1]) there, an op TensorFlow's graph optimizer would
    merge with allgather([1]) of `ones` on that rank only: rank 0 then got
    `ones` for `rows` and the others waited for it.  Also the gradient of a
    grouped allgather, whose per-input size allgathers look alike the same way
    (it failed in tf.function, and gives the eager result now)."""
    rank, size = rank_size()
    shard = tf.ones([1 if rank == 0 else 2, 2])
    x, z = tf.constant([float(rank + 1)] * (1 if rank == 0 else 2)), tf.constant([1.0, 2.0])

    def step(tag):
        rows = hvd.allgather(tf.reshape(tf.shape(shard)[0], [1]), name="rows" + tag)
        ones = hvd.allgather(tf.constant([1]), name="ones" + tag)
        with tf.GradientTape() as tape:
            tape.watch([x, z])
            gx, gz = hvd.grouped_allgather([x, z], name="xz" + tag)
            loss = tf.reduce_sum(gx * gx * float(rank + 1)) + tf.reduce_sum(gz)
        return [rows, ones] + tape.gradient(loss, [x, z])

    graph = [t.numpy().tolist() for t in tf.function(lambda: step("_graph"))()]
    eager = [t.numpy().tolist() for t in step("_eager")]
    assert graph[:2] == [[1] + [2] * (size - 1), [1] * size], graph
    assert graph == eager, (graph, eager)


def test_barrier_waits_for_the_last_rank():
    # time.time() is one clock for every process on this host.
    def enter():
        hvd.barrier()
        return time.time()

    for _ in range(2):
        last_arrival, exits = _barrier_times(enter)
        assert all(t >= last_arrival for t in exits), (last_arrival, exits)


def test_barrier_in_tf_function():
    @tf.function
    def step():
        hvd.barrier()
        return tf.timestamp()  # stateful ops run in program order: after the barrier

    last_arrival, exits = _barrier_times(lambda: float(step()))
    assert all(t >= last_arrival for t in exits), (last_arrival, exits)


def test_object_collectives():
    rank, size = rank_size()
    obj = hvd.broadcast_object({"from": rank, "data": list(range(rank + 3))}, root_rank=size - 1)
    assert obj == {"from": size - 1, "data": list(range(size + 2))}
    objs = hvd.allgather_object(("rank", rank, "x" * rank))
    assert objs == [("rank", r, "x" * r) for r in range(size)]
    # The usual idiom: only the root has the object, the others pass None (and
    # each rank's object is of another type in the allgather).
    state = {"epoch": 3} if rank == 0 else None
    assert hvd.broadcast_object(state, root_rank=0) == {"epoch": 3}
    mixed = hvd.allgather_object(None if rank == 0 else {"r": rank})
    assert mixed == [None] + [{"r": r} for r in range(1, size)]


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


def _launcher_env(name: str) -> int:
    """What the launcher said about this process: mpirun's OMPI_COMM_WORLD_<name>,
    or (tfhvdrun --gloo) Horovod's HOROVOD_<name>."""
    import os

    for key in ("OMPI_COMM_WORLD_" + name, "HOROVOD_" + name):
        if key in os.environ:
            return int(os.environ[key])
    raise AssertionError("the launcher set neither OMPI_COMM_WORLD_%s nor HOROVOD_%s"
                         % (name, name))


def test_topology_matches_the_launcher():
    """Every rank runs on this host: local = global, one cross rank; the launcher's
    own variables (mpirun's, or tfhvdrun --gloo's) say where each rank is."""
    rank, size = rank_size()
    assert rank == _launcher_env("RANK")
    assert size == _launcher_env("SIZE")
    assert hvd.local_rank() == _launcher_env("LOCAL_RANK") == rank
    assert hvd.local_size() == _launcher_env("LOCAL_SIZE") == size
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.is_homogeneous() is True
    everyone = hvd.allgather_object((hvd.rank(), hvd.local_rank(), hvd.local_size()),
                                    name="topology")
    assert everyone == [(r, r, size) for r in range(size)]


# Values that fp16 and bf16 cannot both hold: 1 + 2**-13 is 1.0 in both;
# 1 + 2**-9 is exact in fp16 (10 mantissa bits) but 1.0 in bf16 (7 bits).
WIRE_VALUES = [1.0 + 2.0 ** -13, 1.0 + 2.0 ** -9]
WIRE_EXPECTED = {
    "none": lambda n: [n * WIRE_VALUES[0], n * WIRE_VALUES[1]],
    "fp16": lambda n: [float(n), n * WIRE_VALUES[1]],
    "bf16": lambda n: [float(n), float(n)],
}
COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                "bf16": hvd.Compression.bf16}


@pytest.mark.parametrize("wire", sorted(COMPRESSIONS))
def test_compression_travels_in_the_wire_dtype(wire):
    """The result carries the wire dtype's rounding, and the timeline shows the
    bytes of 16-bit values going through the allreduce."""
    from timeline_probe import recorded, spans

    rank, size = rank_size()
    n = 500
    x = tf.constant(np.tile(WIRE_VALUES, n // 2), tf.float32)
    comp = COMPRESSIONS[wire]
    (out, grouped), events = recorded(lambda: (
        hvd.allreduce(x, op=hvd.Sum, compression=comp, name="wire_" + wire),
        hvd.grouped_allreduce([x, x[:2]], op=hvd.Sum, compression=comp,
                              name="wire_grouped_" + wire)))
    assert out.dtype == tf.float32
    want = np.tile(np.float32(WIRE_EXPECTED[wire](size)), n // 2)
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(grouped[1].numpy(), want[:2])
    bytes_per_value = 4 if wire == "none" else 2
    moved = {s["tensor"]: s["args"]["bytes"] for s in spans(events, "allreduce")}
    assert moved.get("wire_" + wire) == n * bytes_per_value, moved
    assert sorted(v for k, v in moved.items() if k.startswith("wire_grouped_")) == \
        [2 * bytes_per_value, n * bytes_per_value], moved
