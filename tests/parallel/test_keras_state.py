"""Keras 3 under mpirun: saving and loading, config round trips, broadcasting a
checkpoint loaded on rank 0, mixed precision, PartialDistributedOptimizer and
bad input.  Size-agnostic; see ``keras_checks.py`` for the conventions.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest

import keras_checks as kc
import tfhvd.keras as hvd
from tfhvd._keras.optimizer import is_distributed, reduction_of

hvd.init()


@pytest.fixture
def shared_dir():
    """A directory made by rank 0 and seen by all ranks (one machine)."""
    path = tempfile.mkdtemp(prefix="tfhvd-keras-") if hvd.rank() == 0 else None
    path = hvd.broadcast_object(path, 0, name="shared_dir")
    yield path
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def _opt_state(opt):
    return [v.numpy() for v in opt.variables]


# ------------------------------------------------------------------ config

CONFIG_CASES = {
    "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=1.0),
    "adam": lambda: keras.optimizers.Adam(0.01, global_clipnorm=2.0),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, clipvalue=0.5),
}


def _fit_with(opt, steps=6, seed=0):
    """One epoch of ``steps`` batches from rank 0's start; returns (weights, timeline)."""
    from timeline_probe import recorded

    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n, steps=steps)
    model = kc.build_model(keras, seed=100 + r + seed)
    model.compile(optimizer=opt, loss=kc.LOSS)
    _, events = recorded(lambda: model.fit(
        x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]))
    return [w.copy() for w in model.get_weights()], events, int(opt.iterations)


def _reduction_signature(events):
    """What the timeline says the optimizer's reductions were: bytes per gradient
    value (the wire dtype) and the groups of one update."""
    import re

    from timeline_probe import spans

    grads = [s for s in spans(events, "allreduce") if "_Allreduce_" in s["tensor"]]
    groups = sorted({int(re.search(r"_Allreduce_(\d+)", s["tensor"]).group(1)) for s in grads})
    # The model's variables: 6x8 + 8 + 8x3 + 3 values.
    per_update = sum(s["args"]["bytes"] for s in grads) / max(1, len(grads) // 4)
    return {"groups": groups, "bytes_per_value": per_update / (6 * 8 + 8 + 8 * 3 + 3),
            "reductions": len(grads)}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_get_config_from_config_round_trip(name):
    opt = hvd.DistributedOptimizer(CONFIG_CASES[name](), name="Mine",
                                   compression=hvd.Compression.fp16, backward_passes_per_step=3,
                                   op=hvd.Sum, groups=2, sparse_as_dense=True)
    config = opt.get_config()
    assert config["tfhvd"]["backward_passes_per_step"] == 3
    again = type(opt).from_config(config)
    assert type(again) is type(opt) and again.get_config() == config
    settings = reduction_of(again)
    assert (settings.compression, settings.op, settings.groups, settings.sparse_as_dense,
            settings.name) == (hvd.Compression.fp16, hvd.Sum, 2, True, "Mine")
    payload = json.loads(json.dumps(keras.optimizers.serialize(opt)))
    restored = keras.optimizers.deserialize(payload)
    assert type(restored) is type(opt) and restored.get_config() == config

    # Behaviour after the round trip: the copies train exactly like the original,
    # which trains differently from default settings; the timeline shows fp16 on
    # the wire, two groups, and one reduction per 3 batches (6 batches: 2).
    original = _fit_with(opt)
    copies = [_fit_with(again), _fit_with(restored)]
    default = _fit_with(hvd.DistributedOptimizer(CONFIG_CASES[name]()))
    # Bit for bit where the sum's order is fixed (MPI, or two ranks); Gloo's ring
    # sums 3+ ranks' fp16 values in an order that depends on where a value sits in
    # the fused buffer, so there the copies must agree far closer than the default.
    exact = hvd.size() <= 2 or not hvd.gloo_enabled()
    tol = 0.0 if exact else 3e-3
    for weights, events, iterations in [original] + copies:
        for a, b in zip(original[0], weights, strict=True):
            if exact:
                np.testing.assert_array_equal(a, b)
            else:
                np.testing.assert_allclose(a, b, rtol=0, atol=tol)
        assert iterations == 2
        sig = _reduction_signature(events)
        assert sig == {"groups": [0, 1], "bytes_per_value": 2.0, "reductions": 2 * 4}, sig
    assert default[2] == 6 and _reduction_signature(default[1])["bytes_per_value"] == 4.0
    apart = max(float(np.max(np.abs(a - b)))
                for a, b in zip(original[0], default[0], strict=True))
    assert apart > max(1e-6, 4 * tol), apart


def test_loss_scale_optimizer_round_trip():
    lso = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.01), initial_scale=128.0), compression=hvd.Compression.bf16)
    assert isinstance(lso, keras.optimizers.LossScaleOptimizer) and is_distributed(lso)
    payload = json.loads(json.dumps(keras.optimizers.serialize(lso)))
    restored = keras.optimizers.deserialize(payload)
    assert isinstance(restored, keras.optimizers.LossScaleOptimizer)
    assert is_distributed(restored) and restored.initial_scale == 128.0
    assert reduction_of(restored).compression is hvd.Compression.bf16
    # It still reduces, in bf16, and its ranks stay in step.
    weights, events, _ = _fit_with(restored, steps=2)
    assert _reduction_signature(events)["bytes_per_value"] == 2.0
    everyone = hvd.allgather_object(weights, name="lso_round_trip")
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_sync_batch_norm_round_trip():
    layer = hvd.SyncBatchNormalization(momentum=0.7, epsilon=1e-4)
    payload = json.loads(json.dumps(keras.layers.serialize(layer)))
    restored = keras.layers.deserialize(payload)
    assert type(restored) is type(layer) and restored.momentum == 0.7
    # The restored layer still normalises with the global batch's statistics.
    r, n = hvd.rank(), hvd.size()
    restored(np.full([4, 3], float(r), "float32"), training=True)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(restored.moving_mean),
                               np.full([3], 0.3 * (n - 1) / 2.0), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ bad input

def test_bad_input_errors():
    for bad in ("adam", keras.optimizers.Adam, 3, keras.layers.Dense(2)):
        with pytest.raises(TypeError, match="Keras optimizer instance"):
            hvd.DistributedOptimizer(bad)
    for op in (hvd.Min, hvd.Max, hvd.Product):  # (Adasum: tests/parallel/test_adasum.py)
        with pytest.raises(ValueError, match="hvd.Average"):
            hvd.DistributedOptimizer(keras.optimizers.SGD(), op=op)
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="backward_passes_per_step"):
            hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=steps)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.SGD()))
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=3),
                                 backward_passes_per_step=2)
    pathless = hvd.callbacks.BestModelCheckpoint()  # Horovod's estimator sets the path
    with pytest.raises(ValueError, match="BestModelCheckpoint has no filepath"):
        pathless.set_model(keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)]))
        pathless.on_train_begin()
    with pytest.raises(ValueError, match="root_rank"):
        hvd.callbacks.BroadcastGlobalVariablesCallback(hvd.size())


_BEFORE_INIT = r"""
import json, keras, numpy as np
import tfhvd.keras as hvd
# Horovod's callbacks are made before hvd.init() (on a Spark driver, for its
# estimator): making them works; training with them before init does not.
callbacks = {
    "BroadcastGlobalVariablesCallback": lambda: hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    "MetricAverageCallback": lambda: hvd.callbacks.MetricAverageCallback(),
    "LearningRateWarmupCallback": lambda: hvd.callbacks.LearningRateWarmupCallback(0.1),
    "LearningRateScheduleCallback": lambda: hvd.callbacks.LearningRateScheduleCallback(0.1, 0.5),
    "BestModelCheckpoint": lambda: hvd.callbacks.BestModelCheckpoint(filepath="x.keras"),
}
cases = {
    "DistributedOptimizer": lambda: hvd.DistributedOptimizer(keras.optimizers.SGD()),
    "load_model": lambda: hvd.load_model("x.keras"),
}
made = {}
for name, make in callbacks.items():
    try:
        made[name] = make()
    except Exception as e:
        made[name] = "made: %s: %s" % (type(e).__name__, e)
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x, y = np.ones((4, 2), "float32"), np.ones((4, 1), "float32")
for name, cb in made.items():
    if isinstance(cb, str):
        cases[name] = lambda cb=cb: cb
    else:
        cases[name] = lambda cb=cb: model.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
out = {}
for name, make in cases.items():
    try:
        result = make()
        out[name] = result if isinstance(result, str) else "no error"
    except Exception as e:
        out[name] = "%s: %s" % (type(e).__name__, e)
# After init, the callbacks made before it train, and a pathless
# BestModelCheckpoint writes where .filepath was set later.
import os, sys, tempfile
hvd.init()
path = os.path.join(tempfile.mkdtemp(), "best.keras")
pathless = hvd.callbacks.BestModelCheckpoint(monitor="loss")
pathless.filepath = path
history = model.fit(x, y, epochs=2, verbose=0, callbacks=[
    made["BroadcastGlobalVariablesCallback"], made["MetricAverageCallback"],
    made["LearningRateWarmupCallback"], pathless])
out["after init"] = "trained, best model written" if os.path.exists(path) else \
    "no file at %s" % path
print("RESULT " + json.dumps(out))
"""


def test_using_the_api_before_init_says_to_call_init():
    if hvd.rank() != 0:
        pytest.skip("runs once, in a subprocess started by rank 0")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HYDRA_"))}
    proc = subprocess.run([sys.executable, "-c", _BEFORE_INIT], env=env, capture_output=True,
                          text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-2000:]
    outcomes = json.loads(lines[-1][len("RESULT "):])
    assert outcomes.pop("after init") == "trained, best model written", outcomes
    assert len(outcomes) == 7, outcomes
    for name, outcome in outcomes.items():
        assert outcome.startswith("NotInitializedError") and name in outcome \
            and "hvd.init()" in outcome, (name, outcome)


# ------------------------------------------------------------------ save / load

def test_save_and_load_model_restore_the_wrapped_optimizer(shared_dir):
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    model = kc.build_model(keras, seed=100 + r,
                           norm_layer=lambda: hvd.SyncBatchNormalization(momentum=0.8))
    model.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.Adam(0.01), compression=hvd.Compression.fp16,
        backward_passes_per_step=2, average_aggregated_gradients=True), loss=kc.LOSS)
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = os.path.join(shared_dir, "model.keras")
    if r == 0:
        model.save(path)
    hvd.barrier()
    loaded = hvd.load_model(path)
    plain = keras.models.load_model(path)  # registration alone is enough
    saved = {"weights": [w.copy() for w in loaded.get_weights()],
             "opt": _opt_state(loaded.optimizer),
             "iterations": int(loaded.optimizer.iterations)}
    original = {"weights": [w.copy() for w in model.get_weights()],
                "opt": _opt_state(model.optimizer)}
    # Every rank runs the collectives below before any assertion can stop it.
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0)

    assert type(loaded.optimizer) is type(model.optimizer)
    settings = reduction_of(loaded.optimizer)
    assert settings.compression is hvd.Compression.fp16
    assert settings.backward_passes_per_step == 2 and settings.average_aggregated_gradients
    assert isinstance(loaded.layers[1], hvd.SyncBatchNormalization)
    assert is_distributed(plain.optimizer)
    assert saved["iterations"] == kc.STEPS // 2
    assert len(original["opt"]) == len(saved["opt"])
    for a, b in zip(original["opt"] + original["weights"], saved["opt"] + saved["weights"],
                    strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_load_model_wraps_a_plain_optimizer_keeping_its_state(shared_dir):
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    path = os.path.join(shared_dir, "plain.keras")
    saved_state = None
    if r == 0:
        plain = kc.build_model(keras, seed=5)
        plain.compile(optimizer=keras.optimizers.Adam(0.01), loss=kc.LOSS)
        plain.fit(x[0], y[0], batch_size=kc.BATCH, epochs=1, verbose=0)
        plain.save(path)
        saved_state = [v.numpy() for v in plain.optimizer.variables]
    saved_state = hvd.broadcast_object(saved_state, 0, name="plain_state")
    loaded = hvd.load_model(path, compression=hvd.Compression.bf16)
    state = [v.numpy() for v in loaded.optimizer.variables]
    iterations = int(loaded.optimizer.iterations)
    loaded.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0)
    everyone = hvd.allgather_object(loaded.get_weights(), name="plain_after")

    assert is_distributed(loaded.optimizer)
    assert reduction_of(loaded.optimizer).compression is hvd.Compression.bf16
    assert iterations == kc.STEPS
    for a, b in zip(saved_state, state, strict=True):
        np.testing.assert_array_equal(a, b)
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_broadcast_after_rank0_loaded_a_checkpoint(shared_dir):
    """Rank 0 restores a trained model (weights and Adam state); the others start
    fresh.  At the first batch every rank must hold rank 0's restored state."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    path = os.path.join(shared_dir, "ckpt.keras")
    if r == 0:
        src = kc.build_model(keras, seed=9)
        src.compile(optimizer=keras.optimizers.Adam(0.01), loss=kc.LOSS)
        src.fit(x[0], y[0], batch_size=kc.BATCH, epochs=2, verbose=0)
        src.save(path)
    hvd.barrier()
    if r == 0:
        model = hvd.load_model(path)
    else:
        model = kc.build_model(keras, seed=100 + r)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                      loss=kc.LOSS)
    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0 and not seen:
                seen["weights"] = [w.copy() for w in self.model.get_weights()]
                seen["opt"] = [v.numpy() for v in self.model.optimizer.variables]

    expected = None
    if r == 0:
        expected = {"weights": model.get_weights(),
                    "opt": [v.numpy() for v in model.optimizer.variables]}
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Probe()])
    expected = hvd.broadcast_object(expected, 0, name="ckpt_expected")
    final = hvd.allgather_object(model.get_weights(), name="ckpt_final")
    assert int(np.asarray(expected["opt"][0])) == 2 * kc.STEPS  # Adam's iteration count
    for key in ("weights", "opt"):
        assert len(seen[key]) == len(expected[key])
        for a, b in zip(seen[key], expected[key], strict=True):
            np.testing.assert_array_equal(a, b, err_msg=key)
    for other in final[1:]:
        for a, b in zip(final[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_best_model_checkpoint_holds_the_best_epoch(shared_dir, mode):
    """Rank 0 alone writes; the file holds the weights of the epoch with the best
    averaged val_loss.  With mode="max" the best epoch is an early one (training
    lowers the loss), so a checkpoint of the last epoch would not pass."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.05)), loss=kc.LOSS)
    target = os.path.join(shared_dir, "best_%s_rank%d.keras" % (mode, r))
    epochs = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epochs.append((float(logs["val_loss"]), [w.copy() for w in self.model.get_weights()]))

    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=4, shuffle=False, verbose=0,
              validation_data=(x[r], y[r]),
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback(),
                         hvd.callbacks.BestModelCheckpoint(monitor="val_loss", mode=mode,
                                                           filepath=target),
                         Probe()])
    hvd.barrier()
    written = sorted(f for f in os.listdir(shared_dir) if f.startswith("best_%s_" % mode))
    assert written == ["best_%s_rank0.keras" % mode], written
    losses = [loss for loss, _ in epochs]
    best = int(np.argmin(losses) if mode == "min" else np.argmax(losses))
    if mode == "max":
        assert best != len(epochs) - 1, losses
    loaded = hvd.load_model(os.path.join(shared_dir, written[0]))
    assert is_distributed(loaded.optimizer)
    for a, b in zip(loaded.get_weights(), epochs[best][1], strict=True):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ mixed precision

@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("wrap_lso", [False, True], ids=["compile_wraps", "user_wraps"])
def test_mixed_precision_fit(mixed_float16, wrap_lso):
    def make_opt():
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        return keras.optimizers.LossScaleOptimizer(opt) if wrap_lso else opt

    result = kc.run_equivalence(keras, hvd, make_opt)
    opt = result["model"].optimizer
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and is_distributed(opt)
    assert result["model"].layers[0].compute_dtype == "float16"
    kc.assert_equivalent(result, tol=5e-3)


def test_mixed_precision_overflow_on_one_rank_skips_the_step_on_all(mixed_float16):
    """Rank 0's first batch overflows float16.  Every rank must skip that step and
    halve the loss scale (a rank that applied it would wait in the reduction)."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    xr = x[r].copy()
    if r == 0:
        xr[:kc.BATCH] *= 1e6
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=kc.LOSS)
    seen = {}

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                seen["start"] = [w.copy() for w in self.model.get_weights()]
                seen["scale0"] = float(self.model.optimizer.dynamic_scale.numpy())

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                opt = self.model.optimizer
                seen["after"] = [w.copy() for w in self.model.get_weights()]
                seen["scale1"] = float(opt.dynamic_scale.numpy())
                seen["iterations"] = int(opt.iterations)

    model.fit(xr, y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Probe()])
    everyone = hvd.allgather_object(seen, name="overflow_seen")
    final = hvd.allgather_object(model.get_weights(), name="overflow_final")
    for record in everyone:
        assert record["scale1"] == record["scale0"] / 2, record
        assert record["iterations"] == 0
        for a, b in zip(record["start"], record["after"], strict=True):
            np.testing.assert_array_equal(a, b)
    for other in final[1:]:
        for a, b in zip(final[0], other, strict=True):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b)
               for a, b in zip(everyone[0]["start"], final[0], strict=True))


# ------------------------------------------------------------------ partial

def test_partial_distributed_optimizer_keeps_local_layers_local():
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    keras.utils.set_random_seed(100 + r)
    model = keras.Sequential([keras.Input((kc.FEATURES,)),
                              keras.layers.Dense(8, activation="tanh", name="shared"),
                              keras.layers.Dense(kc.CLASSES, activation="softmax",
                                                 name="local_head")])
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                          local_layers=[model.get_layer("local_head")])
    model.compile(optimizer=opt, loss=kc.LOSS)
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    everyone = hvd.allgather_object(
        {layer.name: layer.get_weights() for layer in model.layers}, name="partial")
    assert reduction_of(opt).to_config()["local_variables"] == ["local_head/bias",
                                                                 "local_head/kernel"]
    for other in everyone[1:]:
        for a, b in zip(everyone[0]["shared"], other["shared"], strict=True):
            np.testing.assert_array_equal(a, b)
        assert any(not np.allclose(a, b) for a, b in zip(everyone[0]["local_head"],
                                                         other["local_head"], strict=True))
    with pytest.raises(ValueError, match="local_layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD())
