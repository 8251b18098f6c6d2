"""A model saved during ``fit`` loads in a fresh process with plain
``keras.models.load_model`` once a tfhvd Keras face is imported, and training
resumes from it with the learning-rate callbacks.

The file is written and read by two fresh Pythons: the reader has made no
DistributedOptimizer and run no callback, so only what importing the face
registers can resolve the saved names (``tfhvd>DistributedOptimizer``, and
``tfhvd>ScaledSchedule``, which a checkpoint taken while a learning-rate
callback scales a schedule holds).
"""

import textwrap

COMMON = """
import numpy as np, keras
import tfhvd.keras as hvd
hvd.init()
x = np.linspace(0, 1, 128, dtype="float32").reshape(32, 4)
y = x.sum(axis=1, keepdims=True)
"""

SAVE = COMMON + """
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.9)
model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
    keras.optimizers.SGD(schedule, momentum=0.9), compression=hvd.Compression.fp16))
# ModelCheckpoint writes at on_epoch_end, while the warmup's ScaledSchedule is in place.
model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[
    hvd.callbacks.LearningRateWarmupCallback(None, warmup_epochs=4),
    keras.callbacks.ModelCheckpoint(PATH)])
print("SAVED", type(model.optimizer._learning_rate).__name__)
"""

LOAD = COMMON + """
model = keras.models.load_model(PATH)
opt = model.optimizer
print("LOADED", type(opt).__module__, type(opt._learning_rate).__name__,
      type(opt._learning_rate.schedule).__name__,
      hvd.load_model(PATH).optimizer.__class__.__module__)
model.fit(x, y, batch_size=8, epochs=3, initial_epoch=2, verbose=0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(None, warmup_epochs=4)])
print("RESUMED", type(opt._learning_rate).__name__, bool(np.isfinite(model.evaluate(x, y, verbose=0))))
"""


def _run(python_run, code: str, path: str):
    out = python_run(textwrap.dedent(code).replace("PATH", repr(path)),
                     env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    return out.stdout


def test_checkpoint_saved_during_fit_loads_and_resumes_in_a_fresh_process(python_run, tmp_path):
    path = str(tmp_path / "ckpt.keras")
    assert "SAVED ExponentialDecay" in _run(python_run, SAVE, path)  # restored after fit
    out = _run(python_run, LOAD, path)
    # The distributed optimizer and the checkpoint's scaled schedule come back
    # without hvd.load_model's custom objects; the resumed fit's warmup takes the
    # user's schedule back out of it and leaves that in place.
    assert "LOADED tfhvd._keras.optimizer ScaledSchedule ExponentialDecay tfhvd._keras.optimizer" \
        in out, out
    assert "RESUMED ExponentialDecay True" in out, out


LEGACY_SAVE_AND_LOAD = """
import os, numpy as np, tensorflow as tf
import tfhvd.tensorflow.keras as hvd
keras = tf.keras
hvd.init()
x = np.linspace(0, 1, 128, dtype="float32").reshape(32, 4)
y = x.sum(axis=1, keepdims=True)

@keras.utils.register_keras_serializable(package="Mine")
class MySGD(keras.optimizers.SGD):
    pass

makers = {
    "Adam": lambda: keras.optimizers.Adam(0.01),
    "legacy.SGD": lambda: keras.optimizers.legacy.SGD(0.02, momentum=0.5),
    "MySGD": lambda: MySGD(0.03),
}
for tag, make in makers.items():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(make()))
    model.fit(x, y, batch_size=8, verbose=0)
    for kind in ("h5", "savedmodel"):
        path = os.path.join(FOLDER, tag + (".h5" if kind == "h5" else ""))
        model.save(path)
        for how, load in (("hvd", hvd.load_model), ("keras", keras.models.load_model)):
            opt = load(path).optimizer
            print("LOADED", tag, kind, how, isinstance(opt, type(make())),
                  type(opt).__module__, round(float(opt.learning_rate.numpy()), 4))
"""


def test_tf_keras_model_with_a_distributed_optimizer_loads_from_h5_and_savedmodel(
        python_run, tmp_path):
    """Horovod's own test saves a DistributedOptimizer model as a SavedModel and its
    ResNet-50 example resumes from ``.h5`` files with ``hvd.load_model``: tf-keras
    reads both with its legacy deserialiser, which found no built-in optimizer by
    name ("Unknown object: 'Adam'")."""
    out = python_run(LEGACY_SAVE_AND_LOAD.replace("FOLDER", repr(str(tmp_path))),
                     env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"},
                     timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rate = {"Adam": 0.01, "legacy.SGD": 0.02, "MySGD": 0.03}
    for tag in rate:
        for kind in ("h5", "savedmodel"):
            for how in ("hvd", "keras"):
                want = "LOADED %s %s %s True tfhvd._keras.optimizer %s" % (
                    tag, kind, how, rate[tag])
                assert want in out.stdout, (want, out.stdout)


FACTORY_SAVE_AND_LOAD = """
import os, tempfile
import numpy as np
import tensorflow as tf
legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if legacy:
    import tfhvd.tensorflow.keras as hvd
    keras = tf.keras
else:
    import keras
    import tfhvd.keras as hvd
hvd.init()


class TestOptimizer(keras.optimizers.RMSprop):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)


made = []


def factory(**kw):
    made.append(sorted(kw))
    return hvd.DistributedOptimizer(TestOptimizer(**kw))


for ext in ([".h5", ".keras"] if legacy else [".keras"]):
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])
    model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(
        TestOptimizer(learning_rate=1e-4)))
    model.train_on_batch(np.ones((1, 3)), np.ones((1, 2)))
    path = os.path.join(FOLDER, "m" + ext)
    model.save(path)
    del made[:]
    loaded = hvd.load_model(path, custom_objects={"TestOptimizer": factory})
    opt = loaded.optimizer
    loaded.train_on_batch(np.ones((1, 3)), np.ones((1, 2)))
    print("LOADED", ext, len(made), "learning_rate" in made[0], isinstance(opt, TestOptimizer),
          type(opt).__module__, round(float(np.asarray(opt.learning_rate)), 6))
"""


def test_horovods_custom_objects_factory_loads_a_distributed_optimizer(python_run, tmp_path):
    """Horovod's test_load_model_custom_objects: ``custom_objects={"Cls": lambda **kw:
    hvd.DistributedOptimizer(Cls(**kw))}``.  Keras handed the factory itself (Keras 3,
    tf-keras's .keras) or the distributed optimizer it made (tf-keras's .h5) to the
    loader, which failed ("type 'function' is not an acceptable base type", "Cannot
    create a consistent method resolution order")."""
    code = FACTORY_SAVE_AND_LOAD.replace("FOLDER", repr(str(tmp_path)))
    for legacy, exts in (("1", (".h5", ".keras")), ("0", (".keras",))):
        out = python_run(code, env={"TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": legacy},
                         timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        for ext in exts:
            want = "LOADED %s 1 True True tfhvd._keras.optimizer 0.0001" % ext
            assert want in out.stdout, (legacy, want, out.stdout)
