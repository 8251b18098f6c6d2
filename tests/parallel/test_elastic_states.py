"""hvd.elastic states and the run loop, at any size: under ``mpirun -np N`` and
as one plain process (``pytest tests/parallel/test_elastic_states.py``).

No driver here, so a reset is ``shutdown()`` + ``init()`` in the same world;
what these check is what the states keep, roll back and share, when the loop
restores, and that the exact-recovery data gives the same weights at any size.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.keras as hvdk
import tfhvd.tensorflow as hvd
from tfhvd.common import elastic as common_elastic
from tfhvd.common.elastic_worker import HostUpdateResult

hvd.init()


def _same_everywhere(value) -> bool:
    values = hvd.allgather_object(value, name="same_everywhere")
    return all(np.allclose(np.asarray(v), np.asarray(values[0])) for v in values)


def _model(seed=1):
    tf.keras.utils.set_random_seed(seed + hvd.rank())  # different start on each rank
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.Dense(1)])
    return model


def test_object_state_commit_restore_sync():
    state = hvd.elastic.ObjectState(epoch=0, best=None, names=["a"])
    state.epoch = 3 + hvd.rank()
    state.names.append("b")
    state.commit()
    state.epoch = 99
    state.best = "x"
    state.restore()
    assert state.epoch == 3 + hvd.rank() and state.best is None
    state.sync()
    assert state.epoch == 3 and state.names == ["a", "b"]
    assert _same_everywhere(state.epoch)


def test_keras_state_round_trips_weights_slots_and_counters():
    model = _model()
    opt = tf.keras.optimizers.Adam(0.1)
    state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0, epoch=0)
    assert opt.built, "the state builds the optimizer so every worker syncs the same list"
    x = tf.ones([2, 4])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))

    step()
    state.batch, state.epoch = 5, 1
    state.commit()
    committed = [v.numpy().copy() for v in model.variables + list(opt.variables)]
    step()
    step()
    state.batch = 7
    state.restore()
    now = [v.numpy() for v in model.variables + list(opt.variables)]
    assert all(np.array_equal(a, b) for a, b in zip(committed, now))
    assert int(opt.iterations.numpy()) == 1 and state.batch == 5 and state.epoch == 1
    state.sync()
    assert _same_everywhere(np.concatenate([v.numpy().ravel() for v in model.variables]))
    assert _same_everywhere(np.concatenate([v.numpy().ravel() for v in opt.variables]))


def test_tensorflow_state_and_unbuilt_model_errors():
    v = tf.Variable([float(hvd.rank())] * 3)
    state = hvd.elastic.TensorFlowState([v], step=0)
    v.assign([7.0] * 3)
    state.restore()
    assert v.numpy().tolist() == [float(hvd.rank())] * 3
    state.sync()
    assert v.numpy().tolist() == [0.0] * 3
    with pytest.raises(ValueError, match="variables"):
        hvd.elastic.TensorFlowState()
    with pytest.raises(ValueError, match="must be built"):
        hvd.elastic.TensorFlowKerasState(tf.keras.Sequential([tf.keras.layers.Dense(1)]))


def test_host_update_raises_on_every_rank_at_the_same_commit():
    state = hvd.elastic.ObjectState(step=0)
    state.commit()  # no update: no one raises
    # Only rank 0's view counts: an update that reached rank 1 only is ignored...
    if hvd.rank() == 1:
        state.on_hosts_updated(5, HostUpdateResult.added)
    if hvd.size() > 1:
        state.commit()
    state.on_reset()
    # ...and one that reached rank 0 only makes everyone raise, at this commit.
    if hvd.rank() == 0:
        state.on_hosts_updated(7, HostUpdateResult.removed)
    with pytest.raises(hvd.HostsUpdatedInterrupt) as info:
        state.commit()
    assert info.value.skip_sync  # removal only: survivors hold the same state
    state.commit()  # handled: the next commit passes


def test_run_restores_after_internal_error_and_not_after_host_update():
    state = hvd.elastic.ObjectState(batch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])
    calls = []

    @hvd.elastic.run
    def train(state, fail):
        calls.append(state.batch)
        if len(calls) == 1:
            state.batch = 1
            state.commit()
            state.batch = 2  # not committed: lost on a peer failure
            raise fail
        if len(calls) == 2:
            state.batch += 10
            if hvd.rank() == 0:
                state.on_hosts_updated(1, HostUpdateResult.added)
            state.commit()  # raises HostsUpdatedInterrupt on every rank
        return state.batch

    restores = []
    real_restore = state.restore
    state.restore = lambda: (restores.append(state.batch), real_restore())
    assert train(state, hvd.HorovodInternalError("peer lost")) == 11
    assert calls == [0, 1, 11] and resets == [hvd.size(), hvd.size()]
    assert restores == [2]  # once, after the peer failure; not after the host update
    assert hvd.is_initialized()


def test_run_recognises_a_failed_tfhvd_op_and_lets_user_errors_through():
    state = hvd.elastic.ObjectState(n=0)
    seen = []

    @hvd.elastic.run
    def train(state):
        seen.append(1)
        if len(seen) == 1:
            raise tf.errors.AbortedError(None, None, "tfhvd: ranks [2] have shut down")
        raise KeyError("user bug")

    with pytest.raises(KeyError, match="user bug"):
        train(state)
    assert len(seen) == 2
    assert not hvd.elastic.is_peer_lost_error(tf.errors.AbortedError(None, None, "other"))


def test_keras_callbacks_track_epoch_and_batch_and_commit():
    model = _model(2)
    model.compile(optimizer=hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 1)), batch_size=2, epochs=1, verbose=0)
    state = hvdk.elastic.KerasState(model, batch=0, epoch=0)
    commits = []
    real_commit = state.commit
    state.commit = lambda: (commits.append((state.epoch, state.batch)), real_commit())
    seen = []

    class Spy(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(state.batch)

    callbacks = [hvdk.elastic.UpdateEpochStateCallback(state),
                 hvdk.elastic.UpdateBatchStateCallback(state),
                 hvdk.elastic.CommitStateCallback(state, batches_per_commit=2), Spy()]
    model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=2, epochs=2, verbose=0,
              callbacks=callbacks)
    assert seen == [1, 2, 3, 4, 1, 2, 3, 4]
    # every 2 batches, and at each epoch end (after the counters moved on)
    assert commits == [(0, 2), (0, 4), (1, 0), (1, 2), (1, 4), (2, 0)]
    assert state.epoch == 2 and state.batch == 0
    with pytest.raises(ValueError, match="batches_per_commit"):
        hvdk.elastic.CommitStateCallback(state, batches_per_commit=0)


def test_elastic_batches_are_a_partition_of_fixed_global_batches():
    data = common_elastic_batches(100, 12, seed=3)
    for size in (1, 2, 3, 4):
        shares = [data.share(2, 5, r, size) for r in range(size)]
        assert np.array_equal(np.concatenate(shares), data.global_batch(2, 5))
    assert not np.array_equal(data.global_batch(0, 0), data.global_batch(1, 0))
    with pytest.raises(ValueError, match="does not divide evenly over 5"):
        data.share(0, 0, 0, 5)


def common_elastic_batches(*args, **kwargs):
    from tfhvd.common.elastic_data import ElasticBatches

    return ElasticBatches(*args, **kwargs)


def _train_exact(x, y, epochs, fail_at=None, distributed=True):
    """Trains with ElasticDataset; optionally a peer 'fails' after an uncommitted step."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    data = hvd.elastic.ElasticDataset((x, y), global_batch_size=12, seed=5)
    state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
    failed = []

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for xb, yb in data.iter_epoch(state, batches_per_commit=2):
                step(xb, yb)
                if fail_at == (state.epoch, state.batch) and not failed:
                    failed.append(1)
                    raise hvd.HorovodInternalError("injected")

    train(state)
    return np.concatenate([v.numpy().ravel() for v in model.variables]), failed


def test_exact_recovery_same_weights_at_any_size_and_after_a_failure():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
    clean, _ = _train_exact(x, y, epochs=2)
    failed_run, failed = _train_exact(x, y, epochs=2, fail_at=(1, 3))
    assert failed == [1]
    np.testing.assert_allclose(failed_run, clean, atol=1e-6)
    assert _same_everywhere(clean)
    # The same training in one process over the whole global batches, without
    # collectives: what every world size must give, within 1e-5.
    np.testing.assert_allclose(clean, _single_process_reference(x, y, epochs=2), atol=1e-5)


def _single_process_reference(x, y, epochs):
    from tfhvd.common.elastic_data import ElasticBatches

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    batches = ElasticBatches(len(x), 12, seed=5)
    for epoch in range(epochs):
        for b in range(batches.batches_per_epoch):
            idx = batches.global_batch(epoch, b)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x[idx]) - y[idx]) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
    return np.concatenate([v.numpy().ravel() for v in model.variables])


def test_elastic_dataset_for_fit_starts_at_the_committed_batch():
    x = np.arange(48, dtype=np.float32).reshape(24, 2)
    y = np.arange(24, dtype=np.float32)
    data = hvd.elastic.ElasticDataset((x, y), global_batch_size=6, seed=2)
    state = hvd.elastic.ObjectState(epoch=1, batch=2)
    batches = list(data.dataset(state))
    assert len(batches) == data.batches_per_epoch - 2
    for b, (xb, yb) in zip(range(2, data.batches_per_epoch), batches):
        idx = data.batches.share(1, b, hvd.rank(), hvd.size())
        assert np.array_equal(yb.numpy(), y[idx]) and np.array_equal(xb.numpy(), x[idx])
    with pytest.raises(ValueError, match="differ in length"):
        hvd.elastic.ElasticDataset((x, y[:3]), global_batch_size=6)
