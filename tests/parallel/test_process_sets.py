"""Process sets on N ranks (run at np 2, 3 and 4): every collective on the even and
the odd set at the same time, dynamic add/remove/re-add, the errors, and the
tape, the Keras optimizer, the callbacks and the object helpers on a set.

Every rank is in exactly one of ``even`` (ranks 0, 2, ...) and ``odd`` (1, 3, ...)
and uses its own (``mine``), so the two disjoint sets always run concurrently,
often under the same tensor names.  Static sets (``init(process_sets=[...])``,
communicator-defined sets) are tested as whole jobs in
tests/single/test_process_sets_jobs.py.
"""

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.common.process_sets import _temp_process_set_object

MODES = ["eager", "function"]
SETS = {}


def run(mode, fn, *args):
    if mode == "eager":
        return fn(*args)
    return tf.function(fn, autograph=False)(*args)


@pytest.fixture(scope="module", autouse=True)
def sets():
    # Dynamic mode: settings are read at init, which other modules did already.
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    n = hvd.size()
    SETS["even"] = hvd.add_process_set(list(range(0, n, 2)))
    SETS["odd"] = hvd.add_process_set(list(range(1, n, 2))) if n > 1 else None
    yield SETS
    for ps in SETS.values():
        if ps is not None and ps.process_set_id is not None:
            hvd.remove_process_set(ps)


def mine():
    return SETS["even"] if hvd.rank() % 2 == 0 else SETS["odd"]


def other():
    return SETS["odd"] if hvd.rank() % 2 == 0 else SETS["even"]


def needs_two():
    if hvd.size() < 2:
        pytest.skip("needs two ranks for two sets")


def global_ok():
    """The runtime still works: a global allreduce after an error."""
    out = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="still_ok").numpy()
    assert out[0] == hvd.size()


def test_set_properties():
    needs_two()
    r, n = hvd.rank(), hvd.size()
    ps = mine()
    want = [k for k in range(n) if k % 2 == r % 2]
    assert ps.ranks == want and ps.size() == len(want) and ps.rank() == want.index(r)
    assert ps.included() is True and other().included() is False
    with pytest.raises(ValueError, match="not part of"):
        other().rank()
    assert str(ps) == "ProcessSet(process_set_id=%d, ranks=%s, mpi_comm=None)" % (
        ps.process_set_id, want)
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(n))
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    # Ids agree on every rank.
    ids = hvd.allgather(tf.constant([[SETS["even"].process_set_id, SETS["odd"].process_set_id]]))
    assert (ids.numpy() == ids.numpy()[0]).all()
    assert SETS["even"].process_set_id != SETS["odd"].process_set_id


@pytest.mark.parametrize("mode", MODES)
def test_every_collective_on_both_sets(mode):
    needs_two()
    r = hvd.rank()
    ps = mine()
    ranks = ps.ranks
    k = len(ranks)
    me = ranks.index(r)

    def body(x):
        out = {}
        out["sum"] = hvd.allreduce(x, op=hvd.Sum, name="x", process_set=ps)
        out["avg"] = hvd.allreduce(x, op=hvd.Average, name="avg", process_set=ps)
        out["max"] = hvd.allreduce(x, op=hvd.Max, name="max", process_set=ps)
        out["pre"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5,
                                   name="pre", process_set=ps)
        out["grouped"] = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, name="gx", process_set=ps)
        out["gather"] = hvd.allgather(tf.fill([r + 1, 2], x[0]), name="g", process_set=ps)
        out["ggather"] = hvd.grouped_allgather([tf.fill([r + 1], x[0]), tf.fill([1, 3], x[0])],
                                               name="gg", process_set=ps)
        out["bcast"] = hvd.broadcast(x, root_rank=ranks[-1], name="b", process_set=ps)
        out["a2a"], out["rsplits"] = hvd.alltoall(
            tf.repeat(x[0] * 10 + tf.range(k, dtype=x.dtype), tf.range(1, k + 1)),
            splits=tf.range(1, k + 1), name="a", process_set=ps)
        out["rs"] = hvd.reducescatter(tf.fill([2 * k, 2], x[0]), op=hvd.Sum, name="rs",
                                      process_set=ps)
        out["grs"] = hvd.grouped_reducescatter([tf.fill([k], x[0]), tf.fill([k, 2], x[0])],
                                               op=hvd.Sum, name="grs", process_set=ps)
        return out

    out = run(mode, body, tf.constant([float(r), 1.0]))
    hvd.barrier(process_set=ps)
    total = float(sum(ranks))
    np.testing.assert_allclose(out["sum"], [total, k])
    np.testing.assert_allclose(out["avg"], [total / k, 1.0])
    np.testing.assert_allclose(out["max"], [max(ranks), 1.0])
    np.testing.assert_allclose(out["pre"], [total, k])
    np.testing.assert_allclose(out["grouped"][1], [2 * total, 2 * k])
    want_gather = np.concatenate([np.full([q + 1, 2], q) for q in ranks])
    np.testing.assert_allclose(out["gather"], want_gather)
    np.testing.assert_allclose(out["ggather"][0], np.concatenate([np.full(q + 1, q)
                                                                 for q in ranks]))
    assert out["ggather"][1].shape == (k, 3)
    np.testing.assert_allclose(out["bcast"], [ranks[-1], 1.0])
    # Set member j sends j+1 copies of (10*rank + j') to j'... each rank receives
    # (me + 1) rows from every member q: value 10*q + me.
    want_a2a = np.concatenate([np.full(me + 1, 10 * q + me) for q in ranks])
    np.testing.assert_allclose(out["a2a"], want_a2a)
    np.testing.assert_array_equal(out["rsplits"], np.full(k, me + 1))
    np.testing.assert_allclose(out["rs"], np.full([2, 2], total))
    np.testing.assert_allclose(out["grs"][0], [total])
    np.testing.assert_allclose(out["grs"][1], [[total, total]])


def test_many_fused_allreduces_on_sets_and_global():
    """Small allreduces on a set and on the global set in one graph: fusion
    may combine within a set, never across (mixed results would be wrong)."""
    needs_two()
    r, n = hvd.rank(), hvd.size()
    ps = mine()

    @tf.function(autograph=False)
    def step(x):
        a = [hvd.allreduce(x + i, op=hvd.Sum, name="f%d" % i, process_set=ps) for i in range(8)]
        b = [hvd.allreduce(x + i, op=hvd.Sum, name="f%d" % i) for i in range(8)]
        return a, b

    for _ in range(3):  # later steps go through each set's response cache
        a, b = step(tf.constant([float(r)]))
        for i in range(8):
            assert a[i].numpy()[0] == sum(ps.ranks) + i * len(ps.ranks)
            assert b[i].numpy()[0] == n * (n - 1) / 2 + i * n


def test_overlapping_sets_in_one_graph():
    """A rank in three sets (its parity set, all but the last rank, the global set)
    runs collectives on all three from one graph, in whatever order TensorFlow
    picks; sets that share ranks never deadlock."""
    if hvd.size() < 3:
        pytest.skip("needs three ranks for a third set")
    r, n = hvd.rank(), hvd.size()
    ps = mine()
    lower = hvd.add_process_set(list(range(n - 1)))

    @tf.function(autograph=False)
    def step(x):
        outs = []
        for i in range(6):
            outs.append(hvd.allreduce(x + i, op=hvd.Sum, name="o%d" % i, process_set=ps))
            outs.append(hvd.allreduce(x + i, op=hvd.Sum, name="o%d" % i))
            if lower.included():
                outs.append(hvd.allreduce(x * 2 + i, op=hvd.Sum, name="o%d" % i,
                                          process_set=lower))
        return outs

    try:
        for _ in range(3):
            outs = [o.numpy()[0] for o in step(tf.constant([float(r)]))]
            per = 3 if lower.included() else 2
            for i in range(6):
                assert outs[per * i] == sum(ps.ranks) + i * ps.size()
                assert outs[per * i + 1] == n * (n - 1) / 2 + i * n
                if lower.included():
                    assert outs[per * i + 2] == 2 * sum(lower.ranks) + i * lower.size()
    finally:
        assert hvd.remove_process_set(lower) is True


def test_disjoint_sets_progress_independently():
    """While one set's ranks are busy elsewhere, the other set's collectives finish."""
    needs_two()
    ps = mine()
    for busy in ("even", "odd"):
        if ps is SETS[busy]:
            time.sleep(4.0)
            elapsed = None
        else:
            t0 = time.monotonic()
            for i in range(5):
                out = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="indep_%d" % i,
                                    process_set=ps)
                assert out.numpy()[0] == ps.size()
            elapsed = time.monotonic() - t0
        hvd.barrier()
        if elapsed is not None:
            assert elapsed < 3.0, "set %s waited %.1f s for the busy set" % (ps, elapsed)


def test_set_does_not_wait_for_another_sets_collectives():
    """Rank 0 (every set's coordinator) runs a graph of big allreduces on its own
    set while the odd set keeps running small ones: these must not queue behind
    the big ones (which would stall them for the whole graph)."""
    if hvd.size() < 3:
        pytest.skip("needs a set of two ranks with rank 0 in it")
    ps = mine()

    @tf.function(autograph=False)
    def bigs(t):
        return [hvd.allreduce(t, op=hvd.Sum, name="big_%d" % i, process_set=ps)
                for i in range(12)]

    big = tf.ones([16 * 1024 * 1024])  # 64 MiB each
    if ps is SETS["even"]:
        bigs(big)  # trace, and allocate the buffers, before timing
    hvd.barrier()
    latencies, took = [], None
    if ps is SETS["even"]:
        t0 = time.monotonic()
        bigs(big)
        took = time.monotonic() - t0
    else:
        # The set's members stop together: each small allreduce carries whether
        # its sender wants another round (Min: the first to stop stops all).
        t_end = time.monotonic() + 1.5
        i, more = 0, True
        while more:
            t0 = time.monotonic()
            flag = hvd.allreduce(tf.constant([1.0 if time.monotonic() < t_end else 0.0]),
                                 op=hvd.Min, name="small_%d" % i, process_set=ps)
            latencies.append(time.monotonic() - t0)
            more = bool(flag.numpy()[0])
            i += 1
    stats = hvd.allgather_object((took, latencies))
    big_time = min(t for t, _ in stats if t is not None)
    worst = max(x for _, lat in stats for x in lat)
    # Queued behind the graph, one small allreduce would take most of its time
    # (about 0.9 of it when sets share the loop's execution).
    assert worst < 0.5 * big_time, (worst, big_time)


def test_gradients_use_the_set():
    needs_two()
    r = hvd.rank()
    ps = mine()
    x = tf.constant([1.0, 2.0])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        y = hvd.allreduce(x * (r + 1), op=hvd.Sum, name="gy", process_set=ps)
        g = hvd.allgather(x * (r + 1), name="gg", process_set=ps)
        loss_y = tf.reduce_sum(y)
        loss_g = tf.reduce_sum(g * tf.range(tf.size(g), dtype=g.dtype))
    dy = tape.gradient(loss_y, x)
    dg = tape.gradient(loss_g, x)
    # d/dx of sum(allreduce(x*(r+1))) summed over the set's ranks: (r+1) * k.
    np.testing.assert_allclose(dy, np.full(2, (r + 1) * ps.size()))
    # allgather's gradient: the upstream gradient reduced over the set (averaged,
    # or summed: k times that), then this rank's slice of it.
    me = ps.rank()
    base = (r + 1) * np.array([2 * me, 2 * me + 1], dtype=np.float64)
    assert np.allclose(dg, base) or np.allclose(dg, ps.size() * base), (dg, base)


@pytest.mark.parametrize("mode", MODES)
def test_distributed_gradient_tape_on_set(mode):
    needs_two()
    r = hvd.rank()
    ps = mine()
    w = tf.Variable([1.0, 2.0])

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r + 1.0))
        tape = hvd.DistributedGradientTape(tape, process_set=ps)
        return tape.gradient(loss, [w])[0]

    g = run(mode, grads)
    want = np.mean([q + 1.0 for q in ps.ranks])
    np.testing.assert_allclose(g, [want, want])


def test_keras_optimizer_and_callbacks_on_set():
    """A Keras model trained with DistributedOptimizer(process_set=...) equals
    the single-process run on the set's data; the two sets train apart."""
    needs_two()
    import keras

    import keras_checks as kc
    import tfhvd.keras as khvd

    r, n = hvd.rank(), hvd.size()
    ps = mine()
    x, y = kc.rank_data(n)
    model = kc.build_model(keras, seed=100 + r)
    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=ps)
    model.compile(optimizer=opt, loss=kc.LOSS)
    root = ps.ranks[0]
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(root, process_set=ps)])
    initial = kc.build_model(keras, seed=100 + root).get_weights()
    ref = kc.build_model(keras, seed=7)
    ref.set_weights(initial)
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss=kc.LOSS)
    xs, ys, gb = kc.global_batches(x[ps.ranks], y[ps.ranks], kc.BATCH)
    ref.fit(xs, ys, batch_size=gb, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # MetricAverageCallback averages over the set only.
    logs = {"loss": float(r)}
    khvd.callbacks.MetricAverageCallback(process_set=ps).on_epoch_end(0, logs)
    assert logs["loss"] == pytest.approx(np.mean(ps.ranks))


def test_broadcast_variables_and_objects_on_set():
    needs_two()
    r = hvd.rank()
    ps = mine()
    v = tf.Variable([float(r), 1.0])
    hvd.broadcast_variables([v], root_rank=ps.ranks[-1], process_set=ps)
    np.testing.assert_allclose(v.numpy(), [ps.ranks[-1], 1.0])
    obj = hvd.broadcast_object({"from": r}, root_rank=ps.ranks[-1], process_set=ps)
    assert obj == {"from": ps.ranks[-1]}
    assert hvd.allgather_object(("r", r), process_set=ps) == [("r", q) for q in ps.ranks]


def test_size_rank_included_ops():
    needs_two()
    ps, ot = mine(), other()
    assert int(hvd.size_op(ps.process_set_id)) == ps.size()
    assert int(hvd.size_op(process_set=ot)) == ot.size()
    assert int(hvd.rank_op(process_set=ps)) == ps.rank()
    assert int(hvd.rank_op()) == hvd.rank()
    assert int(hvd.process_set_included_op(ps.process_set_id)) == 1
    assert int(hvd.process_set_included_op(process_set=ot)) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a member"):
        hvd.rank_op(process_set=ot)


def test_errors_and_recovery():
    needs_two()
    r, n = hvd.rank(), hvd.size()
    ps, ot = mine(), other()
    # A rank outside the set (local, immediate).
    with pytest.raises(tf.errors.InvalidArgumentError, match="rank %d is not a member" % r):
        hvd.allreduce(tf.constant([1.0]), name="foreign", process_set=ot)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a member"):
        hvd.allgather(tf.constant([1.0]), name="foreign_g", process_set=ot)
    # A broadcast root outside the set.
    with pytest.raises(tf.errors.InvalidArgumentError, match="root rank %d is not a member"
                       % ot.ranks[0]):
        hvd.broadcast(tf.constant([1.0]), root_rank=ot.ranks[0], name="bad_root",
                      process_set=ps)
    # An id that does not exist: a ValueError in Python, before any op (as Horovod).
    with pytest.raises(ValueError, match="does not exist"):
        hvd.allreduce(tf.constant([1.0]), name="ghost", process_set=_temp_process_set_object(999))
    with pytest.raises(TypeError, match="hvd.ProcessSet"):
        hvd.allreduce(tf.constant([1.0]), process_set=[0, 1])
    global_ok()
    # Negotiated errors: every rank gets the same ValueError.
    with pytest.raises(ValueError, match="more than once"):
        hvd.add_process_set([0, 0])
    with pytest.raises(ValueError, match="rank %d is out of range for %d" % (n, n)):
        hvd.add_process_set([0, n])
    with pytest.raises(ValueError, match="duplicate process set"):
        hvd.add_process_set(list(ps.ranks if r % 2 == 0 else ot.ranks))  # the even set again
    with pytest.raises(ValueError, match="different process sets"):
        hvd.add_process_set([r])
    with pytest.warns(UserWarning, match="global process set cannot be removed"):
        assert hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.remove_process_set(hvd.ProcessSet([0])) is False  # never registered
    global_ok()
    out = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after_errors", process_set=ps)
    assert out.numpy()[0] == ps.size()


def test_dynamic_remove_and_readd():
    needs_two()
    r = hvd.rank()
    odd = SETS["odd"]
    old_id = odd.process_set_id
    assert hvd.remove_process_set(odd) is True
    assert odd.process_set_id is None and odd.size() is None and odd.included() is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(tf.constant([1.0]), process_set=odd)
    if r % 2 == 1:
        with pytest.raises(ValueError, match="does not exist"):
            hvd.allreduce(tf.constant([1.0]), name="removed",
                          process_set=_temp_process_set_object(old_id))
    global_ok()
    again = hvd.add_process_set(hvd.ProcessSet(list(range(1, hvd.size(), 2))))
    assert again.process_set_id > old_id  # ids are never reused
    ids = hvd.allgather(tf.constant([again.process_set_id])).numpy()
    assert (ids == again.process_set_id).all()
    SETS["odd"] = again
    out = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="x", process_set=mine())
    assert out.numpy()[0] == mine().size()
    # A third set over all but the last rank, used and removed again.
    extra = hvd.add_process_set(list(range(hvd.size() - 1))) if hvd.size() > 2 else None
    if extra is not None:
        if extra.included():
            out = hvd.allreduce(tf.constant([2.0]), op=hvd.Sum, name="x", process_set=extra)
            assert out.numpy()[0] == 2 * extra.size()
        assert hvd.remove_process_set(extra) is True
    global_ok()


def test_a_traced_collective_runs_on_every_call():
    """A tf.function's collective of a constant is not evaluated once when the
    function is optimised (constant folding, Horovod issue 3229): it runs on
    every call, so after its set is removed the next call fails, as in Horovod
    ('process set ... does not exist'), instead of returning the old value."""
    needs_two()
    ps = mine()
    step = tf.function(lambda: hvd.allreduce(tf.constant([2.0]), op=hvd.Sum, name="folded",
                                             process_set=ps))
    assert step().numpy()[0] == 2.0 * ps.size()
    assert step().numpy()[0] == 2.0 * ps.size()
    hvd.barrier()
    for name in ("even", "odd"):
        assert hvd.remove_process_set(SETS[name]) is True
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not exist, or has been removed"):
        step()
    global_ok()
    n = hvd.size()
    SETS["even"] = hvd.add_process_set(list(range(0, n, 2)))
    SETS["odd"] = hvd.add_process_set(list(range(1, n, 2)))


def test_timeline_names_the_set(tmp_path):
    needs_two()
    ps = mine()
    path = str(tmp_path / "tl-{rank}.json")
    hvd.start_timeline(path)
    hvd.allreduce(tf.constant([1.0]), name="timed", process_set=ps)
    hvd.barrier()
    hvd.stop_timeline()
    text = open(path.replace("{rank}", str(hvd.rank()))).read()
    json.loads(text)
    assert "timed (process set %d)" % ps.process_set_id in text


@pytest.mark.parametrize("mode", MODES)
def test_ranks_outside_the_set_keep_their_local_gradients(mode):
    """Horovod's _allreduce_cond: one script runs on every rank; a tape, a Keras
    DistributedOptimizer and a TF1 DistributedOptimizer on a set reduce over the
    set, and on a rank outside it return (apply) the local gradients unchanged."""
    needs_two()
    import keras

    import tfhvd.keras as khvd

    r = hvd.rank()
    ps = other()  # this rank is not in it
    w = tf.Variable([1.0, 2.0])

    def tape_grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r + 1.0))
        return hvd.DistributedGradientTape(tape, process_set=ps).gradient(loss, [w])[0]

    np.testing.assert_allclose(run(mode, tape_grads), [r + 1.0, r + 1.0])

    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=ps)
    v = keras.Variable([0.0, 0.0])
    opt.apply_gradients([(tf.constant([r + 1.0, 2.0 * (r + 1.0)]), v)])
    np.testing.assert_allclose(v.numpy(), [-(r + 1.0), -2.0 * (r + 1.0)])

    legacy = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                      process_set=ps)
    u = tf.Variable([3.0])
    pairs = legacy.compute_gradients(lambda: u * (r + 1.0), var_list=[u])
    np.testing.assert_allclose(pairs[0][0].numpy(), [r + 1.0])
    global_ok()


def test_tf1_distributed_optimizer_reduces_over_its_set():
    """hvd.DistributedOptimizer(tf.compat.v1.train.*, process_set=ps) averages over
    ps, not over every rank."""
    needs_two()
    r = hvd.rank()
    ps = mine()
    u = tf.Variable([3.0])
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                   process_set=ps)
    pairs = opt.compute_gradients(lambda: u * (r + 1.0), var_list=[u])
    np.testing.assert_allclose(pairs[0][0].numpy(), [np.mean([q + 1.0 for q in ps.ranks])])
    global_ok()
