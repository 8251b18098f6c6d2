"""Keras 3 ``fit`` with ``jit_compile=True`` and a DistributedOptimizer, under mpirun.

The train step is split into XLA-compiled parts with the reduction between
them (tfhvd/_keras/xla_split.py).  Each test trains the same model from the
same start with XLA on and off and checks the weights agree on every rank; the
inspection tests check what is compiled and what is not.  Size-agnostic: `make test` runs it
under ``mpirun -np 2`` (not again at 3 ranks: the Makefile's NP3_LEAVE_OUT).
"""

import warnings
from typing import Any, Callable, Dict, List, Optional

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_checks as kc
import tfhvd.keras as hvd
from tfhvd._keras import xla_split
from tfhvd.tensorflow import xla

hvd.init()

HOROVOD_OPS = ("HorovodGroupedAllreduce", "HorovodAllreduce", "HorovodAllgather")


def _fit(make_opt: Callable[[], Any], jit: bool, compile_kwargs: Optional[Dict] = None,
         epochs: int = 2, build: Optional[Callable[[int], Any]] = None,
         data: Optional[tuple] = None, **dist_kwargs: Any) -> Dict[str, Any]:
    r, n = hvd.rank(), hvd.size()
    x, y = data if data is not None else kc.rank_data(n)
    model = (build or (lambda seed: kc.build_model(keras, seed=seed)))(100 + r)
    initial = [w.copy() for w in model.get_weights()]
    opt = hvd.DistributedOptimizer(make_opt(), **dist_kwargs)
    model.compile(optimizer=opt, loss=kc.LOSS, jit_compile=jit, **(compile_kwargs or {}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=epochs, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    weights = [w.copy() for w in model.get_weights()]
    return {"model": model, "weights": weights, "initial": initial,
            "warnings": [str(w.message) for w in caught if "tfhvd" in str(w.message)]}


def _run_pair(make_opt: Callable[[], Any], **kwargs: Any) -> Dict[str, Any]:
    """The XLA and the non-XLA distributed fit, and every rank's XLA weights."""
    xla = _fit(make_opt, True, **kwargs)
    plain = _fit(make_opt, False, **kwargs)
    everyone = hvd.allgather_object(xla["weights"], name="xla_weights")
    return {"xla": xla, "plain": plain, "everyone": everyone}


def _assert_same_as_plain(pair: Dict[str, Any], tol: float = 1e-5) -> None:
    xla, plain = pair["xla"], pair["plain"]
    step = xla_split.step_of(xla["model"])
    assert step is not None and step.split is True, "the XLA fit did not split its step"
    assert xla["model"].jit_compile is True and not xla["warnings"], xla["warnings"]
    kc.assert_ranks_identical(pair["everyone"])
    for a, b in zip(xla["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol,
                                   err_msg="XLA fit differs from the non-XLA fit")
    assert any(not np.allclose(a, b, atol=1e-4)  # (rank 0 started from its own weights)
               for a, b in zip(xla["weights"], xla["initial"], strict=True)), "nothing trained"


OPTIMIZERS = {
    "adam_clipvalue": lambda: keras.optimizers.Adam(0.01, clipvalue=0.02),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05,
                                                            global_clipnorm=0.05),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_xla_fit_equals_non_xla_fit_on_every_rank(name):
    _assert_same_as_plain(_run_pair(OPTIMIZERS[name]))


VARIANTS = {
    "groups_2": ({"groups": 2}, {}),
    "fp16_wire": ({"compression": hvd.Compression.fp16}, {}),
    "op_sum": ({"op": hvd.Sum}, {}),
    "steps_per_execution_2": ({}, {"steps_per_execution": 2}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_xla_fit_variants(name):
    dist_kwargs, compile_kwargs = VARIANTS[name]
    _assert_same_as_plain(_run_pair(OPTIMIZERS["adam_clipvalue"], compile_kwargs=compile_kwargs,
                                    **dist_kwargs))


def test_xla_fit_with_loss_scaling():
    """mixed_float16: a LossScaleOptimizer around the distributed optimizer."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        pair = _run_pair(OPTIMIZERS["sgd_momentum"])
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert isinstance(pair["xla"]["model"].optimizer, keras.optimizers.LossScaleOptimizer)
    _assert_same_as_plain(pair, tol=5e-3)


def test_xla_fit_with_loss_scaling_and_fp16_on_the_wire():
    """The split reduced the loss-scaled gradients where the step without XLA
    reduces unscaled ones: compressed to fp16 they overflowed, and the XLA fit
    skipped steps (loss scale 8192) that the plain fit applied (32768)."""
    xla = kc.loss_scaled_run(keras, hvd, True, compression=hvd.Compression.fp16)
    plain = kc.loss_scaled_run(keras, hvd, False, compression=hvd.Compression.fp16)
    assert (xla["scale"], xla["iterations"]) == (plain["scale"], plain["iterations"])
    for a, b in zip(xla["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _embedding_model(seed: int) -> Any:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((kc.FEATURES,), dtype="int32"),
                             keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                             keras.layers.Dense(kc.CLASSES, activation="softmax")])


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_xla_fit_with_embedding_gradients(sparse_as_dense):
    n = hvd.size()
    x, y = kc.rank_data(n)
    ids = (np.abs(x) * 3).astype("int32") % 10
    _assert_same_as_plain(_run_pair(OPTIMIZERS["adam_clipvalue"], build=_embedding_model,
                                    data=(ids, y), sparse_as_dense=sparse_as_dense))


# ---------------------------------------------------------------- what is compiled

def _called_functions(graph: Any, library: Dict[str, Any]) -> List[Any]:
    """FunctionDefs called from ``graph``'s ops (one level)."""
    out = []
    for op in graph.get_operations():
        if op.type in ("PartitionedCall", "StatefulPartitionedCall"):
            out.append(library[op.get_attr("f").name])
    return out


def test_compiled_parts_are_xla_functions_and_collectives_are_outside():
    result = _fit(OPTIMIZERS["adam_clipvalue"], True, epochs=1)
    model = result["model"]
    step = xla_split.step_of(model)
    assert step is not None and step.split is True
    # The two compiled parts are jit_compile functions...
    for part in (step.compute, step.update):
        assert isinstance(part, tf.types.experimental.PolymorphicFunction)
        assert part._jit_compile is True and part.experimental_get_tracing_count() >= 1
    # ...and the step that Keras runs calls them, marked for XLA, from an
    # uncompiled graph that holds the fused reduction.
    x, y = kc.rank_data(hvd.size())
    spec = (tf.TensorSpec([None, kc.FEATURES], tf.float32), tf.TensorSpec([None], tf.int32))
    outer = tf.function(lambda data: step(data)).get_concrete_function(spec)
    library = {f.signature.name: f for f in outer.graph.as_graph_def().library.function}
    called = _called_functions(outer.graph, library)
    xla_called = [f for f in called if f.attr["_XlaMustCompile"].b]
    assert len(xla_called) == 2, [f.signature.name for f in called]
    outer_types = {op.type for op in outer.graph.get_operations()}
    if hvd.size() > 1:
        assert "HorovodGroupedAllreduce" in outer_types, sorted(outer_types)
    for f in xla_called:
        inner_types = {node.op for node in f.node_def}
        assert not inner_types & set(HOROVOD_OPS), inner_types
    # XLA compiles the forward/backward pass: its HLO has the layers' dots.
    hlo = step.compute.experimental_get_compiler_ir((tf.constant(x[0][:kc.BATCH]),
                                                     tf.constant(y[0][:kc.BATCH])))("hlo")
    assert "dot(" in hlo, hlo[:2000]


def test_evaluate_and_predict_keep_xla():
    result = _fit(OPTIMIZERS["sgd_momentum"], True, epochs=1)
    model = result["model"]
    x, y = kc.rank_data(hvd.size())
    loss = model.evaluate(x[0], y[0], verbose=0)
    probs = model.predict(x[0], verbose=0)
    assert model.jit_compile is True and np.isfinite(loss)
    assert probs.shape == (len(x[0]), kc.CLASSES)


# ---------------------------------------------------------------- XLA kept off

def test_sync_batch_norm_keeps_xla_off_with_a_warning():
    norm = lambda: hvd.SyncBatchNormalization(momentum=0.8)  # noqa: E731
    result = _fit(OPTIMIZERS["sgd_momentum"], True, epochs=1,
                  build=lambda seed: kc.build_model(keras, seed=seed, norm_layer=norm))
    assert result["model"].jit_compile is False
    assert xla_split.step_of(result["model"]) is None
    assert len(result["warnings"]) == 1, result["warnings"]
    assert "SyncBatchNormalization" in result["warnings"][0]
    assert "jit_compile=False" in result["warnings"][0]


def test_gradient_accumulation_keeps_xla_off_with_a_warning():
    result = _fit(OPTIMIZERS["sgd_momentum"], True, epochs=1, backward_passes_per_step=2)
    assert result["model"].jit_compile is False
    assert any("accumulates gradients" in m for m in result["warnings"]), result["warnings"]


class TwiceApplied(keras.Sequential):
    """A custom train step that applies the optimizer twice: not splittable."""

    def train_step(self, data):
        x, y = data
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply(grads, self.trainable_weights)
        return {"loss": loss}


def test_unsplittable_custom_train_step_falls_back_with_a_warning():
    def build(seed):
        keras.utils.set_random_seed(seed)
        return TwiceApplied([keras.Input((kc.FEATURES,)),
                              keras.layers.Dense(kc.CLASSES, activation="softmax")])

    pair = _run_pair(OPTIMIZERS["sgd_momentum"], build=build, epochs=1)
    step = xla_split.step_of(pair["xla"]["model"])
    assert step is not None and step.split is False
    assert any("2 times" in m for m in pair["xla"]["warnings"]), pair["xla"]["warnings"]
    for a, b in zip(pair["xla"]["weights"], pair["plain"]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


class OwnCollective(keras.Sequential):
    """A custom train step that averages its loss over ranks itself: with XLA
    ops that allreduce is compiled into the step's forward/backward part (an
    XLA custom call); without them the step runs without XLA."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        return {"loss": hvd.allreduce(loss, name="own_loss")}


def _own_collective(seed):
    keras.utils.set_random_seed(seed)
    return OwnCollective([keras.Input((kc.FEATURES,)),
                          keras.layers.Dense(kc.CLASSES, activation="softmax")])


def test_custom_train_step_with_its_own_collective_compiles_it():
    assert xla.xla_ops_refusal() is None, xla.xla_ops_refusal()
    pair = _run_pair(OPTIMIZERS["sgd_momentum"], build=_own_collective, epochs=1)
    step = xla_split.step_of(pair["xla"]["model"])
    assert step is not None and step.split is True
    assert not any("runs a collective itself" in m for m in pair["xla"]["warnings"]), \
        pair["xla"]["warnings"]
    kc.assert_ranks_identical(pair["everyone"])
    for a, b in zip(pair["xla"]["weights"], pair["plain"]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_custom_train_step_with_its_own_collective_falls_back_without_xla_ops(monkeypatch):
    # As with TFHVD_ENABLE_XLA_OPS=0 (read once per process, so set here).
    monkeypatch.setattr(xla, "_why_not", ["XLA ops are off for this test"])
    pair = _run_pair(OPTIMIZERS["sgd_momentum"], build=_own_collective, epochs=1)
    step = xla_split.step_of(pair["xla"]["model"])
    assert step is not None and step.split is False
    assert any("runs a collective itself" in m for m in pair["xla"]["warnings"]), \
        pair["xla"]["warnings"]
    kc.assert_ranks_identical(pair["everyone"])
    for a, b in zip(pair["xla"]["weights"], pair["plain"]["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


class AutoOnGpu(keras.Sequential):
    """Keras's "auto" as it resolves on a machine with a GPU (it means off on a CPU)."""

    def _resolve_auto_jit_compile(self):
        return True


def test_jit_compile_auto_resolved_on_is_split():
    def build(seed):
        keras.utils.set_random_seed(seed)
        return AutoOnGpu([keras.Input((kc.FEATURES,)),
                          keras.layers.Dense(kc.CLASSES, activation="softmax")])

    result = _fit(OPTIMIZERS["sgd_momentum"], "auto", epochs=1, build=build)
    step = xla_split.step_of(result["model"])
    assert result["model"].jit_compile is True and not result["warnings"], result["warnings"]
    assert step is not None and step.split is True
