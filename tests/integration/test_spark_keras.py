"""tfhvd.spark.keras.KerasEstimator on a real Spark cluster:
local-cluster[2,1,1024] (a master, two workers, an executor JVM each, on this
machine), started here.  Fit, transform and reload; the trained weights equal
the same training written by hand under tfhvd.spark.run; resuming a run from
its checkpoint in the Store; validation by column and by fraction; scalar,
array and ML vector columns; callbacks and custom objects; a one-row
validation set on two ranks; a model with dict outputs, a double label and a
custom metric, a weights-only checkpoint and the compiled model it returns;
tf-keras; and the errors a bad column gives."""

import io
import os
import sys

import numpy as np
import pytest

import engine_jobs as jobs
from spark_cluster import local_cluster_session

pytest.importorskip("pyarrow")
import keras  # noqa: E402

import tfhvd.spark  # noqa: E402
from tfhvd.spark.common.backend import SparkBackend  # noqa: E402
from tfhvd.spark.common.store import Store  # noqa: E402
from tfhvd.spark.keras import KerasEstimator, KerasModel  # noqa: E402

jobs.by_value(sys.modules[__name__])

ROWS = 64


@pytest.fixture(scope="module")
def spark():
    yield from local_cluster_session()


def data(spark, rows: int = ROWS):
    """features: an array of 4 floats, a scalar, an ML vector; a 0/1 label;
    a validation flag on every 4th row; a double target; a validation flag on
    row 0 only."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    return spark.createDataFrame(
        [(x[i].tolist(), float(x[i, 2]), Vectors.dense(x[i, :2].tolist()), int(y[i]),
          i % 4 == 0, "row%d" % i, float(x[i, 0] + 4.0), i == 0) for i in range(rows)],
        ["feat", "s", "vec", "label", "is_val", "name", "target", "one_val"])


def dense_model(width: int = 4, lib=keras):
    lib.utils.set_random_seed(7)
    return lib.Sequential([lib.Input((width,)), lib.layers.Dense(2, activation="softmax")])


def scaled_loss(y_true, y_pred):
    """A custom loss (it must come back through custom_objects)."""
    return 2.0 * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


def exp_rmspe(y_true, y_pred):
    """Horovod's Rossmann example's metric: y_true (a double column) meets
    y_pred in plain TensorFlow arithmetic, so both must be floatx."""
    y_true = keras.ops.reshape(y_true, keras.ops.shape(y_pred))
    pct = keras.ops.square((keras.ops.exp(y_true) - keras.ops.exp(y_pred))
                           / keras.ops.exp(y_true))
    return keras.ops.sqrt(keras.ops.mean(pct, axis=-1))


class StartWeights(keras.callbacks.Callback):
    """Saves the weights and the optimizer's step count rank 0 starts training
    from (a user callback)."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def on_train_begin(self, logs=None):
        import tfhvd.tensorflow as hvd
        if hvd.rank() == 0:
            np.savez(self.path, *self.model.get_weights(),
                     iterations=int(np.asarray(self.model.optimizer.iterations)))


def reference_training(train_dir: str, config: dict, weights: list, epochs: int) -> list:
    """The estimator's training written by hand as a tfhvd.spark.run job: rank r
    reads Parquet files r, r + size, ... (sorted names) with pyarrow, and fits
    them in order with a DistributedOptimizer and the broadcast callback."""
    import glob

    import keras
    import pyarrow as pa
    import pyarrow.parquet as pq

    import tfhvd.keras as hvd

    hvd.init()
    files = sorted(glob.glob(os.path.join(train_dir, "*.parquet")))[hvd.rank()::hvd.size()]
    table = pa.concat_tables([pq.read_table(f) for f in files])
    x = np.stack(table.column("feat").to_pylist())
    y = np.asarray(table.column("label").to_pylist())
    model = keras.Sequential.from_config(config)
    model.set_weights([np.asarray(w) for w in weights])
    # Horovod's estimator trains at the rate given times the number of processes.
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1 * hvd.size())),
                  loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w.tolist() for w in model.get_weights()]


def test_fit_transform_reload_and_weights_equal_spark_run(spark, tmp_path):
    df = data(spark)
    store = Store.create(str(tmp_path / "store"))
    model = dense_model()
    start = [w.copy() for w in model.get_weights()]
    out = io.StringIO()
    backend = SparkBackend(num_proc=2, stdout=out, stderr=io.StringIO(),
                           prefix_output_with_timestamp=True)
    est = KerasEstimator(backend=backend, store=store, model=model,
                         optimizer=keras.optimizers.SGD(0.1),
                         loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                         feature_cols=["feat"], label_cols=["label"], batch_size=8, epochs=2,
                         shuffle=False, partitions_per_process=2, run_id="plain", verbose=2)
    km = est.fit(df)
    assert isinstance(km, KerasModel) and km.getRunId() == "plain"
    assert len(km.getHistory()["loss"]) == 2 and "accuracy" in km.getHistory()
    assert "[0]<stdout>:Epoch 2/2" in out.getvalue(), out.getvalue()
    # The data went through Parquet in the Store, 2 files per rank.
    train_dir = store.get_localized_path(store.get_train_data_path())
    assert len([f for f in os.listdir(train_dir) if f.endswith(".parquet")]) == 4
    assert store.exists(store.get_run_path("plain") + "/checkpoint.keras")

    ref = tfhvd.spark.run(reference_training, args=(train_dir, model.get_config(),
                                                    [w.tolist() for w in start], 2), num_proc=2)
    trained = km.getModel()
    got = trained.get_weights()
    assert not np.allclose(got[0], start[0]), "the estimator did not train"
    # ... and gives the model back at the rate given, as Horovod does.
    assert float(np.asarray(trained.optimizer.learning_rate)) == pytest.approx(0.1)
    for a, b in zip(got, ref[0]):
        np.testing.assert_allclose(a, np.asarray(b), rtol=0, atol=1e-6)

    pred = km.setOutputCols(["prob"]).transform(df)
    assert pred.columns == df.columns + ["prob"]
    rows = pred.orderBy("name").collect()
    want = km.getModel().predict(np.stack([r["feat"] for r in rows]), verbose=0)
    np.testing.assert_allclose(np.array([r["prob"] for r in rows]), want, atol=1e-5)

    saved = str(tmp_path / "saved_model")
    km.save(saved)
    again = KerasModel.load(saved)
    assert again.getOutputCols() == ["prob"] and again.getHistory() == km.getHistory()
    back = again.transform(df).orderBy("name").collect()
    np.testing.assert_allclose(np.array([r["prob"] for r in back]), want, atol=1e-5)


def test_columns_validation_callbacks_custom_objects_and_resume(spark, tmp_path):
    df = data(spark)
    store = Store.create(str(tmp_path / "store"))
    feat = keras.Input((4,), name="feat")
    s = keras.Input((1,), name="s")
    vec = keras.Input((2,), name="vec")
    h = keras.layers.Concatenate()([feat, s, vec])
    model = keras.Model([feat, s, vec], keras.layers.Dense(2, activation="softmax")(h))
    begin = str(tmp_path / "begin.npz")
    common = dict(num_proc=2, store=store, model=model, loss=scaled_loss,
                  custom_objects={"scaled_loss": scaled_loss},
                  feature_cols=["feat", "s", "vec"], label_cols=["label"], batch_size=8,
                  run_id="resumed", verbose=0, random_seed=3)
    # One validation row on two ranks: each rank validates on a row (the
    # metrics averaged over the ranks match in shape).
    est = KerasEstimator(optimizer=keras.optimizers.Adam(0.01), validation="one_val",
                         epochs=1, **common)
    km = est.fit(df)
    assert "val_loss" in km.getHistory()
    val_rows = store.get_parquet_dataset(store.get_val_data_path()).read()
    assert val_rows.num_rows == 1 and "one_val" not in val_rows.column_names
    first = km.getModel().get_weights()
    pred = km.transform(df)
    assert "label__output" in pred.columns and pred.count() == ROWS

    # The same run id: training resumes from the run's checkpoint (with the
    # custom loss from custom_objects), here on the Parquet already written:
    # the first fit's weights and its optimizer's 4 steps (ceil(63 rows / 8 /
    # 2)), not the model and optimizer given here.
    resumed = KerasEstimator(optimizer=keras.optimizers.Adam(0.01), epochs=1,
                             callbacks=[StartWeights(begin)], **common)
    km2 = resumed.fit_on_parquet()
    started = np.load(begin)
    for i, w in enumerate(first):
        np.testing.assert_allclose(started["arr_%d" % i], w, atol=1e-7)
    assert int(started["iterations"]) == 4
    assert not np.allclose(km2.getModel().get_weights()[0], first[0])

    # Validation by fraction, on a model with dict outputs (Keras orders them
    # by name: a_reg, b_cls) fed by a double label (cast to floatx for the
    # custom metric) and an int one, with a weights-only checkpoint.
    feat = keras.Input((4,), name="feat")
    dict_model = keras.Model(feat, {"b_cls": keras.layers.Dense(2, activation="softmax")(feat),
                                    "a_reg": keras.layers.Dense(1)(feat)})
    ckpt = keras.callbacks.ModelCheckpoint(str(tmp_path / "any.weights.h5"),
                                           save_weights_only=True)
    frac = KerasEstimator(num_proc=2, store=store, model=dict_model, optimizer="adam",
                          loss={"a_reg": "mse", "b_cls": "sparse_categorical_crossentropy"},
                          metrics={"a_reg": [exp_rmspe]}, custom_objects={"exp_rmspe": exp_rmspe},
                          feature_cols=["feat"], label_cols=["target", "label"], batch_size=8,
                          validation=0.5, epochs=1, verbose=0, random_seed=3, run_id="fraction",
                          checkpoint_callback=ckpt)
    km3 = frac.fit(df)
    n = store.get_parquet_dataset(store.get_val_data_path()).read().num_rows
    assert 10 < n < ROWS - 10
    assert [k for k in km3.getHistory() if k.startswith("val_") and "exp_rmspe" in k]
    run = store.get_run_path("fraction")
    assert store.exists(run + "/checkpoint.weights.h5")
    assert not store.exists(run + "/checkpoint.keras")
    # The returned model is compiled as trained, with the plain optimizer and its state.
    trained = km3.getModel()
    assert type(trained.optimizer).__module__.startswith("keras.")
    assert int(np.asarray(trained.optimizer.iterations)) > 0
    rows = df.orderBy("name").collect()
    x = np.stack([r["feat"] for r in rows]).astype("float32")
    y = (np.array([r["target"] for r in rows]), np.array([r["label"] for r in rows]))
    scores = trained.evaluate(x, y, verbose=0, return_dict=True)
    assert any("exp_rmspe" in k for k in scores), scores
    # transform gives the dict's outputs to the label columns' outputs in that order.
    want = trained.predict(x, verbose=0)
    out = km3.transform(df).orderBy("name").collect()
    np.testing.assert_allclose([r["target__output"] for r in out], want["a_reg"][:, 0],
                               atol=1e-5)
    np.testing.assert_allclose([r["label__output"] for r in out], want["b_cls"], atol=1e-5)


def test_tf_keras_model(spark, tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    df = data(spark)
    store = Store.create(str(tmp_path / "store"))
    est = KerasEstimator(num_proc=2, store=store, model=dense_model(2, tf_keras),
                         optimizer=tf_keras.optimizers.SGD(0.1),
                         loss="sparse_categorical_crossentropy", feature_cols=["vec"],
                         label_cols=["label"], batch_size=8, epochs=1, verbose=0)
    km = est.fit(df)
    assert type(km.getModel()).__module__.startswith("tf_keras")
    rows = km.transform(df).collect()
    assert len(rows[0]["label__output"]) == 2


def test_bad_columns_are_named(spark, tmp_path):
    df = data(spark)
    store = Store.create(str(tmp_path / "store"))

    def fit(**kw):
        args = dict(num_proc=2, store=store, model=dense_model(), optimizer="sgd",
                    loss="sparse_categorical_crossentropy", feature_cols=["feat"],
                    label_cols=["label"])
        args.update(kw)
        return KerasEstimator(**args).fit(df)

    with pytest.raises(ValueError, match=r"feature_cols: column 'nope' is not in the "
                                         r"DataFrame \(its columns: feat, s, vec"):
        fit(feature_cols=["nope"])
    with pytest.raises(ValueError, match=r"label_cols: column 'lbl' is not in the DataFrame"):
        fit(label_cols=["lbl"])
    with pytest.raises(ValueError, match=r"feature_cols: column 'name' has type string"):
        fit(feature_cols=["name"])
    with pytest.raises(ValueError, match=r"feature_cols: column 'vec' holds 2 values per row "
                                         r"but the model's input expects shape \(None, 4\)"):
        fit(feature_cols=["vec"])
    with pytest.raises(ValueError, match=r"label_cols: column 'feat' holds 4 values per row "
                                         r"but the model's output has shape \(None, 2\)"):
        fit(label_cols=["feat"])
    ragged = spark.createDataFrame([([1.0] * (2 + i % 2), 1) for i in range(8)], ["feat", "label"])
    with pytest.raises(ValueError, match=r"feature_cols: column 'feat' holds arrays of "
                                         r"different lengths \(2 to 3 values\)"):
        KerasEstimator(num_proc=2, store=store, model=dense_model(), optimizer="sgd",
                       loss="mse", feature_cols=["feat"], label_cols=["label"]).fit(ragged)
    with pytest.raises(ValueError, match="give either backend or num_proc"):
        fit(backend=SparkBackend(num_proc=2))
