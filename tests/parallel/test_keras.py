"""Keras 3 under mpirun: DistributedOptimizer and the callbacks in ``model.fit``.

Run with ``mpirun -np 2`` (and 3); every test is size-agnostic.  See
``keras_checks.py`` for the equivalence set-up and the collective discipline.
"""


import keras
import numpy as np
import pytest

import keras_checks as kc
import tfhvd.keras as hvd
import tfhvd.tensorflow as tfhvd_tf
import tfhvd.tensorflow.keras as tf_hvd

hvd.init()


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "sgd_nesterov_clipnorm": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True,
                                                          clipnorm=0.05),
    "adam_clipvalue": lambda: keras.optimizers.Adam(0.01, clipvalue=0.02),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05,
                                                            global_clipnorm=0.05),
    "rmsprop_momentum": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fit_equals_single_process_on_global_batch(name):
    result = kc.run_equivalence(keras, hvd, OPTIMIZERS[name])
    kc.assert_equivalent(result)


VARIANTS = {
    "groups_2": ({"groups": 2}, {}, 1e-5),
    "predivide_2": ({"gradient_predivide_factor": 2.0}, {}, 1e-5),
    "fp16_wire": ({"compression": hvd.Compression.fp16}, {}, 1e-3),
    "bf16_wire": ({"compression": hvd.Compression.bf16}, {}, 1e-2),
    "steps_per_execution_2": ({}, {"steps_per_execution": 2}, 1e-5),
    "run_eagerly": ({}, {"run_eagerly": True}, 1e-5),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fit_equivalence_variants(name):
    dist_kwargs, compile_kwargs, tol = VARIANTS[name]
    result = kc.run_equivalence(keras, hvd, OPTIMIZERS["adam_clipvalue"],
                                compile_kwargs=compile_kwargs, **dist_kwargs)
    kc.assert_equivalent(result, tol=tol)


def test_op_sum_equals_reference_with_lr_times_size():
    n = hvd.size()
    result = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.SGD(0.05), op=hvd.Sum)
    ref = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.SGD(0.05 * n))
    for d, e in zip(result["dist"], ref["ref"], strict=True):
        np.testing.assert_allclose(d, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "dense"])
def test_embedding_gradients(sparse_as_dense):
    """Embedding gradients are tf.IndexedSlices: gathered across ranks, or densified."""
    r, n = hvd.rank(), hvd.size()
    rng = np.random.RandomState(0)
    x = rng.randint(0, 20, size=(n, kc.STEPS * kc.BATCH, 5)).astype("int32")
    y = rng.randint(0, kc.CLASSES, size=(n, kc.STEPS * kc.BATCH)).astype("int32")

    def build(seed):
        keras.utils.set_random_seed(seed)
        return keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
                                 keras.layers.GlobalAveragePooling1D(),
                                 keras.layers.Dense(kc.CLASSES, activation="softmax")])

    from timeline_probe import spans, recorded

    model = build(100 + r)
    initial = model.get_weights()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.5, momentum=0.5),
                                                     sparse_as_dense=sparse_as_dense),
                  loss=kc.LOSS)
    _, events = recorded(lambda: model.fit(
        x[r], y[r], batch_size=kc.BATCH, epochs=2, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]))
    # The timeline says how the embedding's gradient travelled: densified, it is
    # a [20, 4] float32 allreduce and nothing is gathered; sparse, its values and
    # indices are allgathered at every step.
    gathered = [s for s in spans(events, "allgather") if "_Sparse_" in s["tensor"]]
    reduced = [s["args"]["bytes"] for s in spans(events, "allreduce")
               if "_Allreduce_" in s["tensor"]]
    steps = 2 * kc.STEPS
    initials = hvd.allgather_object(initial, name="embedding_initial")
    everyone = hvd.allgather_object(model.get_weights(), name="embedding_final")
    ref = build(7)
    ref.set_weights(initials[0])
    ref.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.5), loss=kc.LOSS)
    xs = x.reshape(n, kc.STEPS, kc.BATCH, 5).transpose(1, 0, 2, 3).reshape(-1, 5)
    ys = y.reshape(n, kc.STEPS, kc.BATCH).transpose(1, 0, 2).reshape(-1)
    ref.fit(xs, ys, batch_size=n * kc.BATCH, epochs=2, shuffle=False, verbose=0)
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    for d, e in zip(model.get_weights(), ref.get_weights(), strict=True):
        np.testing.assert_allclose(d, e, rtol=1e-5, atol=1e-5)
    if sparse_as_dense:
        assert gathered == [] and reduced.count(20 * 4 * 4) == steps, (gathered, reduced)
    else:
        assert len(gathered) == 2 * steps and 20 * 4 * 4 not in reduced, (gathered, reduced)


def _reduction_ops(reduction, grads, variables):
    """Runs ``reduction.reduce`` in a tf.function; returns the results and the
    input counts of its HorovodGroupedAllreduce ops (one per issued collective)."""
    import tensorflow as tf

    fn = tf.function(lambda: reduction.reduce(grads, variables))
    graph = fn.get_concrete_function().graph
    counts = sorted(len(op.inputs) for op in graph.get_operations()
                    if op.type == "HorovodGroupedAllreduce")
    return [t.numpy() for t in fn()], counts


def test_groups_set_the_number_of_collectives():
    import tensorflow as tf

    from tfhvd._keras.reduction import GradientReduction

    variables = [tf.Variable(tf.zeros([i + 1])) for i in range(5)]
    grads = [tf.fill([i + 1], float(hvd.rank() + 1)) for i in range(5)]
    counts = {}
    for groups in (None, 2, 3):
        out, counts[groups] = _reduction_ops(GradientReduction(groups=groups), grads, variables)
        for o, v in zip(out, variables, strict=True):
            np.testing.assert_allclose(o, np.full(v.shape, (hvd.size() + 1) / 2.0))
    _, counts["lists"] = _reduction_ops(
        GradientReduction(groups=[[variables[0], variables[4]], [variables[2]]]), grads,
        variables)
    assert counts == {None: [5], 2: [2, 3], 3: [1, 2, 2], "lists": [1, 1, 1, 2]}, counts


def test_compression_and_predivide_in_the_optimizer_reduction():
    """DistributedOptimizer's reduction carries the wire dtype's rounding, and
    gradient_predivide_factor keeps an fp16 sum that would overflow finite."""
    import tensorflow as tf

    from tfhvd._keras.reduction import GradientReduction

    n = hvd.size()
    c = tf.constant([1.0 + 2.0 ** -13, 1.0 + 2.0 ** -9])
    got = {name: GradientReduction(compression=comp, op=hvd.Sum).reduce([c])[0].numpy().tolist()
           for name, comp in (("none", hvd.Compression.none), ("fp16", hvd.Compression.fp16),
                              ("bf16", hvd.Compression.bf16))}
    c0, c1 = (float(np.float32(v)) for v in c.numpy())
    assert got == {"none": [float(np.float32(n * c0)), float(np.float32(n * c1))],
                   "fp16": [float(n), float(np.float32(n * c1))],
                   "bf16": [float(n), float(n)]}, got
    big = tf.constant([40000.0, 3.0])  # fits float16; n * 40000 does not
    plain = GradientReduction(compression=hvd.Compression.fp16).reduce([big])[0].numpy()
    pre = GradientReduction(compression=hvd.Compression.fp16,
                            gradient_predivide_factor=float(n)).reduce([big])[0].numpy()
    assert np.isinf(plain[0]) and plain[1] == 3.0, plain
    np.testing.assert_allclose(pre, [40000.0, 3.0], rtol=2e-3)


def test_groups_given_as_variable_lists_reduce_like_one_group():
    """Horovod's groups=[[v1, v2], ...]: the result equals one fused reduction."""
    import tensorflow as tf

    from tfhvd._keras.reduction import GradientReduction

    variables = [tf.Variable(tf.zeros([3])) for _ in range(4)]
    grads = [tf.constant([1.0, 2.0, 3.0]) * (hvd.rank() + 1) * (i + 1) for i in range(4)]
    grouped = GradientReduction(groups=[[variables[2], variables[0]], [variables[3]]])
    out = grouped.reduce(grads, variables)
    expected = GradientReduction().reduce(grads, variables)
    assert grouped._groups([0, 1, 2, 3], variables) == [[0, 2], [3], [1]]
    for a, b in zip(out, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy())
    mean_rank = (hvd.size() + 1) / 2
    np.testing.assert_allclose(out[3].numpy(), [4 * mean_rank, 8 * mean_rank, 12 * mean_rank])


def test_clipping_applies_to_the_averaged_gradient():
    """With clipping active, local clipping before averaging would differ from the
    reference (which clips the global-batch gradient); also check clipping bites."""
    clipped = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.SGD(0.1, clipnorm=0.02))
    free = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.SGD(0.1))
    kc.assert_equivalent(clipped)
    assert any(not np.allclose(a, b, atol=1e-4)
               for a, b in zip(clipped["dist"], free["dist"], strict=True)), \
        "clipnorm=0.02 changed nothing; the clipping case is not exercised"


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_clipvalue"])
def test_backward_passes_per_step_2_equals_doubled_batch(name):
    result = kc.run_equivalence(keras, hvd, OPTIMIZERS[name], passes=2)
    kc.assert_equivalent(result)
    opt = result["model"].optimizer
    assert int(opt.iterations) == 2 * kc.STEPS // 2, "iterations should count updates"


def test_backward_passes_sum_by_default():
    """average_aggregated_gradients=False (Horovod's default) applies the sum of the
    accumulated gradients: with plain SGD that is the reference with lr * passes."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                                     backward_passes_per_step=2), loss=kc.LOSS)
    initial = model.get_weights()
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    initials = hvd.allgather_object(initial, name="sum_initial")
    ref = kc.build_model(keras, seed=7)
    ref.set_weights(initials[0])
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss=kc.LOSS)
    xs, ys, gb = kc.global_batches(x, y, kc.BATCH, passes=2)
    ref.fit(xs, ys, batch_size=gb, epochs=1, shuffle=False, verbose=0)
    for d, e in zip(model.get_weights(), ref.get_weights(), strict=True):
        np.testing.assert_allclose(d, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epochs,samples", [(3, kc.BATCH), (1, kc.BATCH), (2, 3 * kc.BATCH)])
def test_unbuilt_sequential_ends_with_rank_0_weights(epochs, samples):
    """A Sequential without an Input has no weights at on_train_begin (Keras 3
    builds it in the first step): the callback broadcasts after the first
    batch, also when every epoch is a single batch (whose index is 0 each
    time) and when the whole fit is one batch.  The ranks start from their
    own random weights and must end identical."""
    r, n = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(300 + r)
    model = keras.Sequential([keras.layers.Dense(6, activation="tanh"),
                              keras.layers.Dense(kc.CLASSES, activation="softmax")])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss=kc.LOSS)
    assert not model.weights
    x, y = kc.rank_data(n)
    model.fit(x[r][:samples], y[r][:samples], batch_size=kc.BATCH, epochs=epochs,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    state = model.get_weights() + [np.asarray(v) for v in model.optimizer.variables]
    everyone = hvd.allgather_object(state, name="unbuilt_%d_%d" % (epochs, samples))
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


# jit_compile=True (the train step split around the reduction, XLA kept off
# for SyncBatchNormalization): test_keras_xla.py.


def test_warmup_learning_rate_at_every_batch():
    kc.assert_warmup(kc.run_warmup(keras, hvd))


def test_warmup_ends_at_initial_lr_with_steps_per_execution():
    """compile(steps_per_execution=3) calls the batch hook every third batch, the
    last one of an epoch before its last batches: the warmup must still end at
    initial_lr and stay there (and say so)."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n, steps=8)
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss=kc.LOSS, steps_per_execution=3)
    rates = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rates.append(kc.lr_value(self.model.optimizer))

    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=4, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=2), Probe()])
    np.testing.assert_allclose(rates[1:], [0.2] * 3, rtol=1e-6)
    assert rates[0] < 0.2 or n == 1


def test_warmup_end_keeps_a_rate_another_callback_set():
    """ReduceLROnPlateau placed before the warmup in the list: a cut it makes at
    the warmup's last epoch end stays (the warmup's end-of-warmup setting only
    replaces a rate the warmup itself set)."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=kc.LOSS)

    class Cut(keras.callbacks.Callback):  # what ReduceLROnPlateau does on a plateau
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.model.optimizer.learning_rate = 0.05

    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Cut(),
                         hvd.callbacks.LearningRateWarmupCallback(0.2, warmup_epochs=2)])
    np.testing.assert_allclose(kc.lr_value(model.optimizer), 0.05, rtol=1e-6)


def _rates_over_a_schedule(callbacks, epochs):
    """The rate each batch of ``fit`` used, with the optimizer's rate the schedule
    0.1 * 0.9 ** step; checks that the schedule is the optimizer's again afterwards."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.9)
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(kc.lr_value(self.model.optimizer))

    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(schedule)),
                  loss=kc.LOSS)
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks + [Probe()])
    assert isinstance(model.optimizer._learning_rate,
                      keras.optimizers.schedules.ExponentialDecay), "schedule not restored"
    return seen


def test_warmup_scales_a_learning_rate_schedule():
    n = hvd.size()
    seen = _rates_over_a_schedule([hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.LearningRateWarmupCallback(None, warmup_epochs=1)],
                                  epochs=2)
    expected = [0.1 * 0.9 ** t * kc.warmup_lr(1.0, n, t // kc.STEPS, t % kc.STEPS, kc.STEPS, 1)
                for t in range(2 * kc.STEPS)]
    np.testing.assert_allclose(seen, expected, rtol=1e-5)


def test_warmup_then_schedule_callback_both_scale_a_learning_rate_schedule():
    """Horovod's pattern (warmup, then LearningRateScheduleCallbacks) over a
    LearningRateSchedule: the second callback took the first one's scaled schedule
    apart, and the warmup's factor was lost (the rate ran at 0.1 from the start)."""
    n = hvd.size()
    seen = _rates_over_a_schedule(
        [hvd.callbacks.LearningRateWarmupCallback(None, warmup_epochs=2),
         hvd.callbacks.LearningRateScheduleCallback(None, multiplier=0.5, start_epoch=2)],
        epochs=4)
    expected = []
    for t in range(4 * kc.STEPS):
        epoch, batch = divmod(t, kc.STEPS)
        factor = (kc.warmup_lr(1.0, n, epoch, batch, kc.STEPS, 2) if epoch < 2
                  else 0.5 ** (epoch - 2))
        expected.append(0.1 * 0.9 ** t * factor)
    np.testing.assert_allclose(seen, expected, rtol=1e-5)


def test_schedule_callback_staircase():
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(kc.lr_value(self.model.optimizer))

    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=kc.LOSS)
    history = model.fit(
        x[r], y[r], batch_size=kc.BATCH, epochs=4, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.LearningRateScheduleCallback(0.02, 0.5, start_epoch=1),
                   Probe()])
    # A constant multiplier decays from start_epoch, as in Horovod (#3142):
    # epoch 0 keeps the optimizer's 0.01; epoch e >= 1 has 0.02 * 0.5 ** (e - 1).
    expected = [0.01] * kc.STEPS + [0.02] * kc.STEPS + [0.01] * kc.STEPS + [0.005] * kc.STEPS
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], [0.01, 0.02, 0.01, 0.005], rtol=1e-6)


def _schedule_run(callback_kwargs, epochs=4, momentum=0.0):
    """Fits with LearningRateScheduleCallback(**callback_kwargs); records at every
    batch the rate and the momentum buffers just before and just after it acts."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    seen = []

    def buffers(opt):
        return [keras.ops.convert_to_numpy(m).copy() for m in getattr(opt, "momentums", [])]

    class Before(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append({"before": buffers(self.model.optimizer)})

    class After(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen[-1].update(lr=kc.lr_value(self.model.optimizer),
                            after=buffers(self.model.optimizer))

    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01,
                                                                          momentum=momentum)),
                  loss=kc.LOSS)
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Before(),
                         hvd.callbacks.LearningRateScheduleCallback(**callback_kwargs), After()])
    return seen


def test_schedule_callback_callable_multiplier_and_end_epoch():
    seen = _schedule_run(dict(initial_lr=0.01, multiplier=lambda epoch: 1.0 / (epoch + 1),
                              start_epoch=1, end_epoch=3))
    # Epoch 0: before start_epoch; 1 and 2: 0.01 / (epoch + 1); 3: end_epoch is
    # excluded, so the rate of epoch 2 stays.
    expected = [0.01] * kc.STEPS + [0.005] * kc.STEPS + [0.01 / 3] * 2 * kc.STEPS
    np.testing.assert_allclose([s["lr"] for s in seen], expected, rtol=1e-6)


def test_schedule_callback_per_batch_with_steps_per_epoch():
    """staircase=False changes the rate at every batch with epoch + batch /
    steps_per_epoch; the given steps_per_epoch (2, not the 4 fit runs) is used."""
    seen = _schedule_run(dict(initial_lr=0.01, multiplier=lambda epoch: 0.5 ** epoch,
                              staircase=False, steps_per_epoch=2), epochs=2)
    expected = [0.01 * 0.5 ** (e + b / 2.0) for e in range(2) for b in range(kc.STEPS)]
    np.testing.assert_allclose([s["lr"] for s in seen], expected, rtol=1e-6)
    detected = _schedule_run(dict(initial_lr=0.01, multiplier=lambda epoch: 0.5 ** epoch,
                                  staircase=False), epochs=1)
    np.testing.assert_allclose([s["lr"] for s in detected],
                               [0.01 * 0.5 ** (b / kc.STEPS) for b in range(kc.STEPS)], rtol=1e-6)


@pytest.mark.parametrize("correction", [True, False], ids=["corrected", "uncorrected"])
def test_schedule_callback_momentum_correction(correction):
    """When the rate changes from old to new, momentum_correction scales SGD's
    velocity by new / old (and leaves it alone when off)."""
    seen = _schedule_run(dict(initial_lr=0.01, multiplier=0.5, momentum_correction=correction),
                         epochs=3, momentum=0.9)
    changes = 0
    for k in range(1, len(seen)):
        old, new = seen[k - 1]["lr"], seen[k]["lr"]
        ratio = new / old if correction else 1.0
        changes += new != old
        assert seen[k]["before"], "SGD with momentum exposed no velocity buffers"
        for b, a in zip(seen[k]["before"], seen[k]["after"], strict=True):
            np.testing.assert_allclose(a, b * ratio, rtol=1e-6, atol=1e-12)
    assert changes == 2, [s["lr"] for s in seen]
    assert any(np.abs(b).max() > 0 for b in seen[kc.STEPS]["before"]), "no velocity to scale"


def test_metric_average_equal_on_all_ranks():
    kc.assert_metric_average(kc.run_metric_average(keras, hvd))


def test_sync_batch_norm_equals_batch_norm_on_global_batch():
    result = kc.run_equivalence(keras, hvd, OPTIMIZERS["sgd_momentum"],
                                norm_layer=lambda: hvd.SyncBatchNormalization(momentum=0.8),
                                ref_norm_layer=lambda: keras.layers.BatchNormalization(
                                    momentum=0.8))
    kc.assert_equivalent(result)


def test_sync_batch_norm_of_data_far_from_zero_equals_batch_norm():
    """Data whose mean is large against its spread (1000 +- 0.1, a fresh layer's
    moving mean 0): the one-pass E[x^2] - E[x]^2 over the ranks cancelled the
    variance, and the outputs were off by up to 6."""
    r, n = hvd.rank(), hvd.size()
    rng = np.random.RandomState(7)
    full = (1000.0 + 0.1 * rng.randn(4 * n, 3)).astype("float32")
    mine = slice(4 * r, 4 * (r + 1))
    out = np.asarray(hvd.SyncBatchNormalization()(full[mine], training=True))
    want = np.asarray(keras.layers.BatchNormalization()(full, training=True))[mine]
    np.testing.assert_allclose(out, want, atol=0.05)
    assert np.all(np.abs(want) < 3.0)


def test_tf_keras_front_end_is_the_same_implementation():
    import tensorflow as tf

    # Each module keeps its Horovod parameter order; both forward to one implementation.
    assert tf_hvd.DistributedOptimizer.__module__ == hvd.DistributedOptimizer.__module__ \
        == "tfhvd._keras.horovod_api"
    assert hvd.DistributedGradientTape is tfhvd_tf.DistributedGradientTape
    assert tf_hvd.DistributedGradientTape is tfhvd_tf.DistributedGradientTape
    assert tf_hvd.BroadcastGlobalVariablesCallback is hvd.BroadcastGlobalVariablesCallback
    result = kc.run_equivalence(tf.keras, tf_hvd, lambda: tf.keras.optimizers.SGD(0.1,
                                                                                 momentum=0.9))
    kc.assert_equivalent(result)
