"""Gradients of the collectives and DistributedGradientTape on N ranks."""

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd


def grad_of(fn, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x)


def test_allreduce_grad_sum_and_average():
    size = hvd.size()
    x = tf.constant([1.0, 2.0])
    # loss = sum(y) on every rank; d(sum of all ranks' losses)/dx = size for Sum.
    g = grad_of(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Sum, name="gs")), x)
    np.testing.assert_allclose(g.numpy(), [size, size])
    g = grad_of(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Average, name="ga")), x)
    np.testing.assert_allclose(g.numpy(), [1.0, 1.0])


def test_allreduce_grad_max_is_horovods():
    """Horovod's convention: the gradient is allreduced with the forward op (Max)."""
    rank = hvd.rank()
    x = tf.constant([float(rank), -float(rank)])
    g = grad_of(lambda t: tf.reduce_sum(hvd.allreduce(t, op=hvd.Max, name="gm") * (rank + 1.0)),
                x)
    np.testing.assert_allclose(g.numpy(), [hvd.size(), hvd.size()])


def test_grouped_allreduce_grad():
    size = hvd.size()
    xs = [tf.constant([1.0]), tf.constant([2.0, 3.0])]
    with tf.GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="gg")
        loss = tf.add_n([tf.reduce_sum(y) for y in ys])
    gs = tape.gradient(loss, xs)
    np.testing.assert_allclose(gs[0].numpy(), [size])
    np.testing.assert_allclose(gs[1].numpy(), [size, size])


def test_allgather_grad():
    rank, size = hvd.rank(), hvd.size()
    x = tf.ones([rank + 1, 2])
    # y = concat of every rank's x; loss = sum(y * w) with w the row index.
    def fn(t):
        y = hvd.allgather(t, name="gag")
        w = tf.cast(tf.range(tf.shape(y)[0]), tf.float32)[:, None]
        return tf.reduce_sum(y * w)

    g = grad_of(fn, x)
    start = sum(r + 1 for r in range(rank))
    want = np.repeat(np.arange(start, start + rank + 1, dtype=np.float32)[:, None], 2, 1)
    np.testing.assert_allclose(g.numpy(), want)  # averaged over identical ranks


def test_broadcast_grad():
    rank = hvd.rank()
    g = grad_of(lambda t: tf.reduce_sum(hvd.broadcast(t, 0, name="gb") * 3.0), tf.ones([2]))
    np.testing.assert_allclose(g.numpy(), [3.0, 3.0] if rank == 0 else [0.0, 0.0])


def test_alltoall_grad():
    rank, size = hvd.rank(), hvd.size()
    splits = [1] * size
    x = tf.fill([size], float(rank))

    def fn(t):
        y, _ = hvd.alltoall(t, splits=splits, name="gat")
        # Row j came from rank j; weight it by j + 1.
        return tf.reduce_sum(y * tf.range(1.0, size + 1.0))

    g = grad_of(fn, x)
    # The row x[j] went to rank j, which weighted it by rank + 1.
    np.testing.assert_allclose(g.numpy(), np.full([size], rank + 1.0))


def test_reducescatter_grad():
    rank, size = hvd.rank(), hvd.size()
    x = tf.ones([size * 2])

    def fn(t):
        return tf.reduce_sum(hvd.reducescatter(t, op=hvd.Sum, name="grs") * (rank + 1.0))

    g = grad_of(fn, x)
    # Horovod's convention: Sum multiplies the gathered gradient by the set's size.
    want = size * np.repeat(np.arange(1.0, size + 1.0), 2)
    np.testing.assert_allclose(g.numpy(), want)


def test_distributed_gradient_tape_averages():
    rank, size = hvd.rank(), hvd.size()
    w = tf.Variable([1.0, 1.0])
    for use_fn in (False, True):
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * float(rank + 1))
            tape = hvd.DistributedGradientTape(tape)
            return tape.gradient(loss, [w])[0]

        g = tf.function(step)() if use_fn else step()
        np.testing.assert_allclose(g.numpy(), np.full([2], (size + 1) / 2.0))


def test_distributed_gradient_tape_options():
    rank, size = hvd.rank(), hvd.size()
    w = tf.Variable([1.0, 2.0])
    emb = tf.Variable(tf.ones([5, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(rank + 1)) + tf.reduce_sum(
            tf.nn.embedding_lookup(emb, [rank % 5]))
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16,
                                       op=hvd.Sum, sparse_as_dense=True, num_groups=2)
    gw, gemb = tape.gradient(loss, [w, emb])
    np.testing.assert_allclose(gw.numpy(), np.full([2], size * (size + 1) / 2.0))
    assert isinstance(gemb, tf.Tensor)  # densified
    assert float(tf.reduce_sum(gemb)) == 2.0 * size


def test_indexed_slices_allreduce():
    rank, size = hvd.rank(), hvd.size()
    s = tf.IndexedSlices(tf.fill([1, 2], float(rank + 1)), tf.constant([rank]),
                         dense_shape=tf.constant([size, 2]))
    out = hvd.allreduce(s)
    assert isinstance(out, tf.IndexedSlices)
    dense = tf.convert_to_tensor(out).numpy()
    np.testing.assert_allclose(dense[:, 0], (np.arange(size) + 1.0) / size)


def test_predivide_factor_keeps_fp16_sums_in_range():
    """gradient_predivide_factor=F divides by F before the sum and by size/F after.
    With fp16 on the wire, a sum that overflows float16 (65504) without it stays
    finite with it; the ops carry prescale 1/F and postscale F."""
    size = hvd.size()
    big = 40000.0  # fits float16; size * big does not

    def grads(factor):
        w = tf.Variable([1.0, 2.0])

        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(w * tf.constant([big, 3.0]))
            tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.fp16,
                                               gradient_predivide_factor=factor)
            return tape.gradient(loss, [w])[0]

        fn = tf.function(step)
        graph = fn.get_concrete_function().graph
        ops = [op for op in graph.get_operations() if op.type == "HorovodGroupedAllreduce"]
        scales = [(op.get_attr("prescale_factor"), op.get_attr("postscale_factor")) for op in ops]
        return fn().numpy(), step().numpy(), scales

    plain, plain_eager, plain_scales = grads(1.0)
    pre, pre_eager, pre_scales = grads(float(size))
    assert plain_scales == [(1.0, 1.0)], plain_scales
    np.testing.assert_allclose(pre_scales, [(1.0 / size, float(size))], rtol=1e-6)
    for got in (plain, plain_eager):
        assert np.isinf(got[0]) and got[1] == 3.0, got  # the fp16 sum overflowed
    for got in (pre, pre_eager):
        np.testing.assert_allclose(got, [big, 3.0], rtol=2e-3)


def _grouped_ops(fn, *args):
    """The HorovodGroupedAllreduce ops a tf.function holds: their input counts."""
    graph = fn.get_concrete_function(*args).graph
    return sorted(len(op.inputs) for op in graph.get_operations()
                  if op.type == "HorovodGroupedAllreduce")


def test_num_groups_issues_that_many_collectives():
    """num_groups=N: the gradients go out in N grouped allreduces (one op each,
    one negotiated group each in the timeline); without it, in one."""
    from timeline_probe import recorded, tensors

    rank, size = hvd.rank(), hvd.size()
    ws = [tf.Variable(tf.fill([i + 1], 1.0)) for i in range(5)]

    def make(num_groups):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(w) * float(rank + 1) for w in ws])
            tape = hvd.DistributedGradientTape(tape, num_groups=num_groups)
            return tape.gradient(loss, ws)
        return step

    counts = {n: _grouped_ops(make(n)) for n in (0, 2, 3)}
    assert counts == {0: [5], 2: [2, 3], 3: [1, 2, 2]}, counts
    step = make(2)
    grads, events = recorded(step)
    for w, g in zip(ws, grads):
        np.testing.assert_allclose(g.numpy(), np.full(w.shape, (size + 1) / 2.0))
    names = tensors(events, "allreduce")
    assert len(names) == 5, names
    # Grouped members are named "<group>_<i>of<n>": two groups, of 2 and 3.
    groups = sorted(int(n.rsplit("of", 1)[1]) for n in names)
    assert groups == [2, 2, 3, 3, 3], names


def _embedding_step(sparse_as_dense):
    rank = hvd.rank()
    emb = tf.Variable(tf.ones([5, 2]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, [rank % 5]) * float(rank + 1))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        return tf.convert_to_tensor(tape.gradient(loss, [emb])[0])

    return step


def test_sparse_as_dense_reduces_densely():
    """sparse_as_dense=True allreduces the dense [5, 2] gradient; without it the
    IndexedSlices' values and indices are allgathered (op types and timeline)."""
    from timeline_probe import recorded, spans

    rank, size = hvd.rank(), hvd.size()
    kinds = {}
    results = {}
    for dense in (False, True):
        step = _embedding_step(dense)
        graph = step.get_concrete_function().graph
        kinds[dense] = sorted({op.type for op in graph.get_operations()
                               if op.type.startswith("Horovod")})
        out, events = recorded(step)
        results[dense] = (out.numpy(), {a: [s["args"]["bytes"] for s in spans(events, a)]
                                        for a in ("allreduce", "allgather")})
    assert kinds[True] == ["HorovodGroupedAllreduce"], kinds
    assert "HorovodAllgather" in kinds[False] and "HorovodGroupedAllreduce" not in kinds[False]
    dense_bytes = results[True][1]
    assert dense_bytes["allgather"] == [] and dense_bytes["allreduce"] == [5 * 2 * 4], dense_bytes
    sparse_bytes = results[False][1]
    assert sparse_bytes["allreduce"] == [] and len(sparse_bytes["allgather"]) == 2, sparse_bytes
    want = np.zeros([5, 2])
    for r in range(size):
        want[r % 5] += (r + 1.0) / size
    for dense in (False, True):
        np.testing.assert_allclose(results[dense][0], want, rtol=1e-6)


def test_tape_compression_carries_the_wire_rounding():
    """DistributedGradientTape(compression=...): the gradients travel as fp16/bf16."""
    size = hvd.size()
    c = tf.constant([1.0 + 2.0 ** -13, 1.0 + 2.0 ** -9])
    w = tf.Variable([0.0, 0.0])
    out = {}
    for wire, comp in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                       ("bf16", hvd.Compression.bf16)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        tape = hvd.DistributedGradientTape(tape, compression=comp, op=hvd.Sum)
        out[wire] = tape.gradient(loss, [w])[0].numpy().tolist()
    c0, c1 = (float(np.float32(v)) for v in c.numpy())
    assert out["none"] == [float(np.float32(size * c0)), float(np.float32(size * c1))], out
    assert out["fp16"] == [float(size), float(np.float32(size * c1))], out
    assert out["bf16"] == [float(size), float(size)], out


def test_grouped_allgather_and_reducescatter_grads():
    rank, size = hvd.rank(), hvd.size()
    a, b = tf.ones([rank + 1]), tf.ones([size * 2, 2])
    with tf.GradientTape() as tape:
        tape.watch(a)
        tape.watch(b)
        ga, = hvd.grouped_allgather([a], name="gga")
        rs, = hvd.grouped_reducescatter([b], op=hvd.Sum, name="grs2")
        loss = tf.reduce_sum(ga) * 2.0 + tf.reduce_sum(rs) * (rank + 1.0)
    da, db = tape.gradient(loss, [a, b])
    np.testing.assert_allclose(da.numpy(), np.full([rank + 1], 2.0))
    np.testing.assert_allclose(db.numpy()[:, 0], size * np.repeat(np.arange(1.0, size + 1.0), 2))


def test_gradient_collectives_match_across_rank_dependent_scopes():
    """Keras numbers layers per process, so scopes can differ between ranks; the
    backward collectives are named after the forward op and still match."""
    rank, size = hvd.rank(), hvd.size()
    w = tf.Variable([1.0, 2.0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            with tf.name_scope("layer_%d" % (rank + 7)):  # differs on every rank
                y = hvd.allreduce(w * 2.0, op=hvd.Sum, name="fwd", ignore_name_scope=True)
                z = hvd.allgather(w, name="fwd_ag", ignore_name_scope=True)
                b = hvd.broadcast(w, 0, name="fwd_bc", ignore_name_scope=True)
            loss = tf.reduce_sum(y) + tf.reduce_sum(z) + tf.reduce_sum(b)
        return tape.gradient(loss, w)

    g = step()
    want = 2.0 * size + 1.0 + (1.0 if rank == 0 else 0.0)
    np.testing.assert_allclose(g.numpy(), [want, want])
