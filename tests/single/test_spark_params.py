"""The Keras Estimator's logic that needs no Spark job: its parameters'
conversion (Horovod's TypeConverters), its save/load, the checkpoint's name
and resume, and the reader's dtypes and sharding of tiny datasets.  One
process; no SparkContext."""

import numpy as np
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
pytest.importorskip("fsspec")
import keras  # noqa: E402

from tfhvd.spark.common import reader  # noqa: E402
from tfhvd.spark.common.store import LocalStore, Store  # noqa: E402
from tfhvd.spark.keras import KerasEstimator  # noqa: E402
from tfhvd.spark.keras import remote  # noqa: E402


def half_mse(y_true, y_pred):
    """A custom loss (must come back through custom_objects)."""
    return 0.5 * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)


def test_params_are_converted_as_horovods():
    est = KerasEstimator(batch_size=8.0, epochs=2.0, val_batch_size=np.int64(4),
                         feature_cols=("a", "b"), label_cols=["y"], validation=0,
                         loss_weights=(1, 0.5), label_shapes=((2.0, 3),))
    assert est.getBatchSize() == 8 and type(est.getBatchSize()) is int
    assert est.getEpochs() == 2 and type(est.getEpochs()) is int
    assert est.getValBatchSize() == 4 and type(est.getValBatchSize()) is int
    assert est.getFeatureCols() == ["a", "b"]
    assert est.getValidation() == 0.0
    assert est.getLossWeights() == [1.0, 0.5]
    assert est.getLabelShapes() == [[2, 3]]
    est.setEpochs(3.0)
    assert est.getEpochs() == 3 and type(est.getEpochs()) is int
    # Horovod's defaults: empty lists, not None, and not shared between estimators.
    assert est.getMetrics() == [] and est.getCallbacks() == []
    est.getCallbacks().append("x")
    assert KerasEstimator().getCallbacks() == []
    # Arrays and ranges are lists, as Spark's TypeConverters take them.
    est = KerasEstimator(feature_cols=np.array(["a", "b"]), loss_weights=np.array([1, 2]))
    assert est.getFeatureCols() == ["a", "b"] and type(est.getFeatureCols()[0]) is str
    assert est.getLossWeights() == [1.0, 2.0]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(batch_size="16"), TypeError, r'param "batch_size".*expected an integer, got \'16\''),
    (dict(epochs=2.5), TypeError, r'param "epochs".*expected an integer, got 2.5'),
    (dict(batch_size=0), ValueError, r"batch_size: must be at least 1, got 0"),
    (dict(num_proc=True), TypeError, r'param "num_proc".*expected an integer'),
    (dict(feature_cols="a"), TypeError, r'param "feature_cols".*got the string \'a\''),
    (dict(label_cols=["y", 3]), TypeError, r'param "label_cols".*list of column names'),
    (dict(shuffle="yes"), TypeError, r'param "shuffle".*expected True or False'),
    (dict(validation=1.5), ValueError, r"validation: a fraction must be in \[0, 1\)"),
    (dict(validation=[0.1]), TypeError, r'param "validation".*fraction \(float\) or a column'),
    (dict(run_id=7), TypeError, r'param "run_id".*expected a string'),
    (dict(callbacks=keras.callbacks.History()), TypeError, r'param "callbacks".*a list'),
    (dict(custom_objects=[half_mse]), TypeError, r'param "custom_objects".*a dict'),
])
def test_bad_params_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        KerasEstimator(**kwargs)
    name, value = next(iter(kwargs.items()))
    setter = {"num_proc": "setNumProc", "batch_size": "setBatchSize"}.get(name)
    if setter:
        with pytest.raises(error, match=message):
            getattr(KerasEstimator(), setter)(value)


def small_model():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def test_save_and_load_round_trip(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    model = small_model()
    est = KerasEstimator(num_proc=2, store=store, model=model,
                         optimizer=keras.optimizers.Adam(0.02), loss=half_mse,
                         metrics=["mae", keras.metrics.MeanSquaredError()],
                         custom_objects={"half_mse": half_mse}, feature_cols=["x"],
                         label_cols=["y"], validation=0.25, batch_size=16, epochs=3,
                         callbacks=[keras.callbacks.EarlyStopping(patience=2)],
                         checkpoint_callback=keras.callbacks.ModelCheckpoint(
                             "/tmp/x.weights.h5", save_weights_only=True),
                         backend_env={"A": "1"}, random_seed=9, shuffle=False, run_id="r")
    path = str(tmp_path / "est")
    est.save(path)
    with pytest.raises(IOError, match="already exists"):
        est.save(path)
    est.write().overwrite().save(path)

    back = KerasEstimator.load(path)
    assert isinstance(back, KerasEstimator) and back.uid == est.uid
    for getter in ("getNumProc", "getFeatureCols", "getLabelCols", "getValidation",
                   "getBatchSize", "getEpochs", "getBackendEnv", "getRandomSeed",
                   "getShuffle", "getRunId", "getVerbose", "getPartitionsPerProcess"):
        assert getattr(back, getter)() == getattr(est, getter)(), getter
    assert type(back.getStore()) is LocalStore
    assert back.getStore().prefix_path == store.prefix_path
    assert back.getBackend() is None
    for a, b in zip(back.getModel().get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    opt = back.getOptimizer()
    assert isinstance(opt, keras.optimizers.Adam)
    assert opt.get_config()["learning_rate"] == pytest.approx(0.02)
    y = np.ones((2, 2), "float32")
    np.testing.assert_allclose(back.getLoss()(y, 0 * y), half_mse(y, 0 * y))
    assert back.getCustomObjects()["half_mse"](y, y).shape == (2,)
    metrics = back.getMetrics()
    assert metrics[0] == "mae" and isinstance(metrics[1], keras.metrics.MeanSquaredError)
    [stop] = back.getCallbacks()
    assert isinstance(stop, keras.callbacks.EarlyStopping) and stop.patience == 2
    assert back.getCheckpointCallback().save_weights_only

    # A string optimizer, no model: the bare minimum round-trips too.
    bare = tmp_path / "bare"
    KerasEstimator(optimizer="sgd", store=Store.create("memory://est-store")).save(str(bare))
    again = KerasEstimator.load(str(bare))
    assert again.getOptimizer() == "sgd" and again.getModel() is None
    assert again.getStore().prefix_path == "memory://est-store"


def test_save_names_a_parameter_that_cannot_be_pickled(tmp_path):
    import threading

    est = KerasEstimator(transformation_fn=threading.Lock())
    with pytest.raises(ValueError, match="transformation_fn cannot be pickled"):
        est.save(str(tmp_path / "est"))


def test_weights_only_checkpoint_name_and_resume(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    assert remote.checkpoint_filename(store, False) == "checkpoint.keras"
    assert remote.checkpoint_filename(store, True) == "checkpoint.weights.h5"
    assert remote.checkpoint_filename(LocalStore("s", checkpoint_filename="m.h5"),
                                      True) == "m.weights.h5"

    model = small_model()
    callback = keras.callbacks.ModelCheckpoint("/tmp/w.weights.h5", save_weights_only=True)
    est = KerasEstimator(num_proc=2, store=store, model=model, optimizer="sgd", loss="mse",
                         feature_cols=["x"], label_cols=["y"], checkpoint_callback=callback,
                         verbose=0)
    job = est._job(remote.KERAS3, store, "w", None)
    assert not job["resume"] and job["resume_weights"] is None
    assert job["floatx"] == keras.backend.floatx()

    # A weights-only checkpoint in the run's folder: the ranks compile the
    # estimator's model as for a new run, then load those weights.
    weights = tmp_path / "w.weights.h5"
    model.save_weights(str(weights))
    store.write_bytes(store.get_checkpoint_path("w") + "/checkpoint.weights.h5",
                      weights.read_bytes())
    job = est._job(remote.KERAS3, store, "w", None)
    assert not job["resume"] and job["resume_weights"] == weights.read_bytes()
    assert job["optimizer"] == "sgd"
    fresh = small_model()
    for w in fresh.weights:
        w.assign(np.zeros(w.shape))
    remote._load_weights(fresh, job["resume_weights"])
    for a, b in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def write_parquet(store, path, table, files):
    import pyarrow.parquet as pq

    root = store.get_localized_path(path)
    store.fs.makedirs(root, exist_ok=True)
    n = table.num_rows
    for i in range(files):
        part = table.slice(i * n // files, (i + 1) * n // files - i * n // files)
        pq.write_table(part, "%s/part-%05d.parquet" % (root, i))


def take(dataset, batches):
    return [tuple(np.asarray(t) for t in keras.tree.flatten(b))
            for b in dataset.take(batches)]


def test_reader_casts_floats_to_floatx_and_gives_every_rank_rows(tmp_path):
    import pyarrow as pa

    from tfhvd.spark.common import data

    store = LocalStore(str(tmp_path / "store"))
    path = store.get_val_data_path()
    table = pa.table({"f": pa.array([[1.5, 2.5]], pa.list_(pa.float64())),
                      "s": pa.array([3.0], pa.float64()), "i": pa.array([4], pa.int64()),
                      "w": pa.array([0.5], pa.float64())})
    # One row, in one of two files (the other empty), read by two ranks.
    write_parquet(store, path, table, 2)
    rows, specs = data.parquet_metadata(store, path)
    assert rows == 1 and specs["s"]["dtype"] == "float64"
    for rank in range(2):
        ds = reader.make_dataset(store, path, rank, 2, ["f", "s"], ["s", "i"], specs, 2,
                                 [[2], [1]], [[1], [1]], sample_weight_col="w",
                                 floatx=keras.backend.floatx())
        (f, s), (y, i), w = ds.element_spec
        assert f.dtype == s.dtype == y.dtype == w.dtype == keras.backend.floatx()
        assert i.dtype == "int64"
        [batch] = take(ds, 1)
        np.testing.assert_array_equal(batch[0], [[1.5, 2.5], [1.5, 2.5]])
        np.testing.assert_array_equal(batch[3], [4, 4])

    # Three rows on four ranks: each rank gets one (rank 3 the same as rank 0).
    path = store.get_train_data_path()
    write_parquet(store, path, pa.table({"s": pa.array([0.0, 1.0, 2.0])}), 1)
    rows, specs = data.parquet_metadata(store, path)
    firsts = []
    for rank in range(4):
        ds = reader.make_dataset(store, path, rank, 4, ["s"], ["s"], specs, 1, [[1]], [[1]])
        firsts.append(float(np.ravel(take(ds, 1)[0][0])[0]))
    assert firsts == [0.0, 1.0, 2.0, 0.0]


MIXED_PRECISION_MODEL = """
import io, os, sys, pickle, numpy as np, keras
import tfhvd.keras as hvd
from tfhvd.spark.keras import remote
keras.mixed_precision.set_global_policy("mixed_float16")
hvd.init()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, dtype="float32")])
model.compile(loss="mse", optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.02)))
x = np.linspace(0, 1, 64, dtype="float32").reshape(16, 4)
model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
def state(o):
    # keyed as tfhvd matches them: the copy's inner optimizer has its own path prefix
    return {"/".join(v.path.split("/")[-2:]): np.array(v) for v in o.variables
            if "learning_rate" not in v.path}
before = state(model.optimizer)
remote.plain_optimizer(model, size=2)
opt = model.optimizer
print("OUTER", type(opt).__name__, "INNER", type(opt.inner_optimizer).__module__,
      "RATE", round(float(np.asarray(opt.inner_optimizer.learning_rate)), 4))
after = state(opt)
print("STATE", sorted(before) == sorted(after) and all(np.array_equal(before[k], after[k]) for k in before),
      len(after))
path = os.path.join(FOLDER, "m.keras")
model.save(path)
model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0)
print("TRAINS", int(np.asarray(opt.iterations)))
"""

LOAD_WITHOUT_TFHVD = """
import os, keras
model = keras.models.load_model(os.path.join(FOLDER, "m.keras"))
print("LOADED", type(model.optimizer).__name__, type(model.optimizer.inner_optimizer).__module__)
"""


def test_a_mixed_precision_model_comes_back_with_a_plain_optimizer(python_run, tmp_path):
    """Under mixed_float16 Keras wraps the DistributedOptimizer in a
    LossScaleOptimizer: the estimator's trained model kept tfhvd's optimizer
    inside it (unusable without hvd.init(), not loadable without tfhvd)."""
    env = {"TF_CPP_MIN_LOG_LEVEL": "3"}
    out = python_run(MIXED_PRECISION_MODEL.replace("FOLDER", repr(str(tmp_path))), env=env,
                     timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "OUTER LossScaleOptimizer INNER keras.src.optimizers.adam RATE 0.01" in out.stdout, \
        out.stdout
    assert "STATE True" in out.stdout and "TRAINS 4" in out.stdout, out.stdout
    out = python_run(LOAD_WITHOUT_TFHVD.replace("FOLDER", repr(str(tmp_path))), env=env,
                     timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "LOADED LossScaleOptimizer keras.src.optimizers.adam" in out.stdout, out.stdout
