"""docs/COMPATIBILITY.md against tfhvd: every name marked same or differs imports,
and its parameter names are the ones the file lists; every method row (the
methods of a class, ``Class.method``, or of what a factory returns,
``Factory().method``) marked same or differs exists on tfhvd's class or object
(the "tf-keras only" ones in a ``TF_USE_LEGACY_KERAS=1`` process)."""

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from typing import List, Optional, Tuple

import pytest

from tests.conftest import ROOT

MODULES = {"tfhvd.tensorflow", "tfhvd.tensorflow.keras", "tfhvd.keras",
           "tfhvd.tensorflow.mpi_ops", "tfhvd.common.util", "tfhvd.spark", "tfhvd.ray"}
MEMBER_KINDS = ("method", "property", "attribute")

DOC = os.path.join(ROOT, "docs", "COMPATIBILITY.md")


def rows() -> List[Tuple[str, str, str, str]]:
    """(tfhvd module, name, status, parameters) for every table row of the file."""
    out, module = [], None
    with open(DOC) as f:
        for line in f:
            m = re.match(r"## `[\w.]+` \(tfhvd: `([\w.]+)`\)", line)
            if m:
                module = m.group(1)
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if module and len(cells) == 5 and cells[0].startswith("`"):
                out.append((module, cells[0].strip("`"), cells[2], cells[3], cells[1],
                            cells[4]))
    return out


ALL = rows()
ROWS = [r[:4] for r in ALL if r[4] not in MEMBER_KINDS]
MEMBERS = [r for r in ALL if r[4] in MEMBER_KINDS and r[2] in ("same", "differs")]
SUPPORTED = [r for r in ROWS if r[2] in ("same", "differs")]
TF_KERAS_ONLY = [r for r in MEMBERS if r[5].startswith("tf-keras only")]


def test_the_file_lists_the_modules():
    modules = {r[0] for r in ROWS}
    assert modules == MODULES
    assert len(SUPPORTED) > 150
    assert {r[2] for r in ALL} <= {"same", "differs", "missing"}
    # The methods of classes and of returned objects are listed too.
    names = {(r[0], r[1]) for r in MEMBERS}
    assert ("tfhvd.tensorflow", "PartialDistributedGradientTape()."
            "get_local_and_global_gradients") in names
    assert ("tfhvd.tensorflow.mpi_ops", "_basics._get_process_set_ids_and_ranks") in names
    assert ("tfhvd.tensorflow.keras", "DistributedOptimizer()._compute_gradients") in names
    assert ("tfhvd.ray", "BaseHorovodWorker.start_executable") in names
    assert len(MEMBERS) > 60


def _instance(module, factory: str):
    """What tfhvd's factory `factory` returns (a tape, or an optimizer)."""
    import tensorflow as tf

    fn = getattr(module, factory)
    if "Tape" in factory:
        return fn(tf.GradientTape())
    if module.__name__ == "tfhvd.tensorflow":
        return fn(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    keras = tf.keras
    if factory.startswith("Partial"):
        return fn(keras.optimizers.SGD(0.1), local_layers=[keras.layers.Dense(1)])
    return fn(keras.optimizers.SGD(0.1))


def _owner(module_name: str, name: str):
    """The tfhvd class or object a member row `Owner.member` / `Factory().member` is on."""
    module = importlib.import_module(module_name)
    owner_name = name.rsplit(".", 1)[0]
    if owner_name.endswith("()"):
        import tfhvd.tensorflow as hvd

        hvd.init()
        return _instance(module, owner_name[:-2])
    obj = module
    for part in owner_name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@pytest.mark.parametrize("module,name,status,params,kind,note",
                         [r for r in MEMBERS if r not in TF_KERAS_ONLY],
                         ids=["%s.%s" % (r[0], r[1]) for r in MEMBERS if r not in TF_KERAS_ONLY])
def test_listed_method_exists(module, name, status, params, kind, note):
    owner = _owner(module, name)
    member = name.rsplit(".", 1)[1]
    assert owner is not None, "%s.%s: its class or factory is missing" % (module, name)
    assert hasattr(owner, member), "%s.%s is marked %s but tfhvd has no %s" % (
        module, name, status, member)
    if kind != "method" or params == "-":
        return
    got = parameters(getattr(owner, member))
    if got is None or "*args" in got or "**kwargs" in got and status == "same":
        return
    want = [] if params == "(none)" else [p.strip() for p in params.split(",")]
    if "*args" in want:
        return  # Horovod's own member takes anything
    assert got == want, "%s.%s: tfhvd has (%s), docs/COMPATIBILITY.md lists (%s)" % (
        module, name, ", ".join(got), ", ".join(want))


_LEGACY_PROBE = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
import importlib
import tfhvd.tensorflow as hvd
hvd.init()
assert tf.keras.__name__.startswith("tf_keras"), tf.keras.__name__
out = {}
for module_name, name in json.loads(sys.argv[1]):
    module = importlib.import_module(module_name)
    factory, member = name.rsplit(".", 1)
    fn = getattr(module, factory[:-2])
    kwargs = {"local_layers": [tf.keras.layers.Dense(1)]} if factory.startswith("Partial") else {}
    opt = fn(tf.keras.optimizers.SGD(0.1), backward_passes_per_step=2, **kwargs)
    out[module_name + ":" + name] = hasattr(opt, member) and getattr(opt, member) is not None
print("RESULT " + json.dumps(out))
"""


def test_tf_keras_only_methods_exist_under_tf_keras():
    pytest.importorskip("tf_keras", reason="tf-keras is not installed")
    assert TF_KERAS_ONLY, "no row says tf-keras only"
    names = [(r[0], r[1]) for r in TF_KERAS_ONLY]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_"))}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _LEGACY_PROBE, json.dumps(names)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(line[0][len("RESULT "):])
    missing = [k for k, ok in result.items() if not ok]
    assert not missing, "marked tf-keras only but missing under tf-keras: %s" % missing


def parameters(obj) -> Optional[List[str]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.name != "self":
            names.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return names


@pytest.mark.parametrize("module,name,status,params", SUPPORTED,
                         ids=["%s.%s" % (r[0], r[1]) for r in SUPPORTED])
def test_supported_name_has_the_listed_parameters(module, name, status, params):
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    assert obj is not None, "%s.%s is marked %s but does not exist" % (module, name, status)
    if params == "-":
        return
    want = [] if params == "(none)" else [p.strip() for p in params.split(",")]
    got = parameters(obj)
    assert got is not None, "%s.%s has no signature" % (module, name)
    assert got == want, "%s.%s: tfhvd has (%s), docs/COMPATIBILITY.md lists (%s)" % (
        module, name, ", ".join(got), ", ".join(want))


def test_best_model_checkpoint_takes_each_modules_positional_order(tmp_path):
    """horovod.tensorflow.keras's BestModelCheckpoint has save_weights_only
    third, horovod.keras's has none: a positional call means the same in tfhvd."""
    import tfhvd.keras as k3_hvd
    import tfhvd.tensorflow.keras as tf_hvd

    tf_hvd.init()
    path = str(tmp_path / "best.weights.h5")
    tf_face = tf_hvd.callbacks.BestModelCheckpoint("val_acc", 0, True, "max", "epoch",
                                                   filepath=path)
    assert (tf_face.monitor, tf_face.save_weights_only, tf_face.save_best_only) == \
        ("val_acc", True, True)
    assert tf_face.mode == "max"
    k3_face = k3_hvd.callbacks.BestModelCheckpoint("val_acc", 0, "max", "epoch",
                                                   filepath=str(tmp_path / "best.keras"))
    assert (k3_face.monitor, k3_face.save_weights_only) == ("val_acc", False)
    assert k3_face.mode == "max"
    assert isinstance(tf_face, k3_hvd.callbacks.BestModelCheckpoint)
    pathless = tf_hvd.callbacks.BestModelCheckpoint()  # the estimator sets .filepath
    with pytest.raises(ValueError, match="has no filepath"):
        pathless.on_train_begin()


def test_sync_batch_norm_takes_horovods_fused_false():
    """Horovod's SyncBatchNormalization(fused=False) builds under Keras 3 (which
    has no fused kernel); fused=True and synchronized=True are refused by name."""
    import numpy as np
    import tfhvd.keras as k3_hvd
    import tfhvd.tensorflow as tf_hvd

    k3_hvd.init()
    for face in (k3_hvd, tf_hvd):
        layer = face.SyncBatchNormalization(fused=False, momentum=0.5)
        out = layer(np.ones([4, 3], "float32"), training=True)
        assert out.shape == (4, 3)
        with pytest.raises(ValueError, match="cannot use the fused kernel"):
            face.SyncBatchNormalization(fused=True)
        with pytest.raises(ValueError, match="always synchronised"):
            face.SyncBatchNormalization(synchronized=True)
