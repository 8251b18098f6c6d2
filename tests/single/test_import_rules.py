"""The import rules of docs/architecture.md, checked on the sources and on a
running process.

* ``tfhvd.common`` imports nothing above it (only ``tfhvd.common.*`` and
  ``tfhvd.version``), lazy imports included.
* A training process imports no launcher module: the training packages
  (``common``, ``tensorflow``, ``_keras``, ``keras``) name no ``tfhvd.runner``
  module, with one stated exception (the tf.data compute service, which opens a
  server as the launcher does); and a process that imports every face, starts
  tfhvd and reduces a tensor has loaded none.
* The engines (``tfhvd.ray``, ``tfhvd.spark``) reuse the launcher's shared
  pieces but never an entry point of the launcher or of each other, and the
  launcher imports neither engine.

The graph is the one ``test_import_cycles`` builds with ``ast``.
"""

import os
import subprocess
import sys
from typing import Dict, List, Set

from test_import_cycles import ROOT, import_graph

TRAINING = ("tfhvd.common", "tfhvd.tensorflow", "tfhvd._keras", "tfhvd.keras")
# The tf.data compute service's modules host and reach a signed HTTP service,
# the launcher's kind of endpoint; they are imported only by a user who asks
# for the service (tfhvd.tensorflow.data.compute_service).
SERVICE_EXCEPTION = {
    "tfhvd.tensorflow.data.compute_service": {"tfhvd.runner.common",
                                              "tfhvd.runner.compute_service"},
    "tfhvd.tensorflow.data.compute_worker": {"tfhvd.runner.compute_service"},
}
# Modules that start a job; nothing outside their own launcher imports them.
ENTRY_POINTS = ("tfhvd.runner.launch", "tfhvd.runner.api", "tfhvd.runner.__main__",
                "tfhvd.runner.gloo.job", "tfhvd.runner.elastic.launch",
                "tfhvd.runner.elastic.api")
# tfhvdrun's dispatcher and tfhvd.run() may start any of them.
DISPATCHERS = ("tfhvd.runner.launch", "tfhvd.runner.api", "tfhvd.runner.__main__")


def _in(module: str, packages) -> bool:
    if isinstance(packages, str):
        packages = (packages,)
    return any(module == p or module.startswith(p + ".") for p in packages)


def common_violations(graph: Dict[str, Set[str]]) -> List[str]:
    return ["%s -> %s" % (m, t) for m, ts in sorted(graph.items()) if _in(m, "tfhvd.common")
            for t in sorted(ts) if not (_in(t, "tfhvd.common") or t == "tfhvd.version")]


def training_violations(graph: Dict[str, Set[str]]) -> List[str]:
    return ["%s -> %s" % (m, t) for m, ts in sorted(graph.items()) if _in(m, TRAINING)
            for t in sorted(ts)
            if _in(t, "tfhvd.runner") and t not in SERVICE_EXCEPTION.get(m, ())]


def engine_violations(graph: Dict[str, Set[str]]) -> List[str]:
    out = []
    for m, ts in sorted(graph.items()):
        for t in sorted(ts):
            if _in(m, "tfhvd.ray") and _in(t, "tfhvd.spark") or \
                    _in(m, "tfhvd.spark") and _in(t, "tfhvd.ray"):
                out.append("%s -> %s (one engine imports the other)" % (m, t))
            elif _in(m, "tfhvd.runner") and _in(t, ("tfhvd.ray", "tfhvd.spark")):
                out.append("%s -> %s (the launcher imports an engine)" % (m, t))
            elif t in ENTRY_POINTS and m not in DISPATCHERS and \
                    not _in(m, t.rpartition(".")[0] if t.count(".") > 2 else t):
                out.append("%s -> %s (an entry point)" % (m, t))
    return out


def test_common_imports_nothing_above_it():
    graph = import_graph(ROOT, "tfhvd")
    assert "tfhvd.common.elastic_worker" in graph and "tfhvd.common.secret" in graph
    bad = common_violations(graph)
    assert not bad, "tfhvd.common imports modules above it:\n  " + "\n  ".join(bad)


def test_training_packages_name_no_launcher_module():
    bad = training_violations(import_graph(ROOT, "tfhvd"))
    assert not bad, "training modules import the launcher:\n  " + "\n  ".join(bad)


def test_engines_use_shared_pieces_only():
    graph = import_graph(ROOT, "tfhvd")
    assert "tfhvd.runner.engines" in graph["tfhvd.ray.runner"]
    bad = engine_violations(graph)
    assert not bad, "engine and launcher imports that break the rules:\n  " + "\n  ".join(bad)


def test_rule_checks_see_violations():
    """The three checks flag what they are for (made-up edges)."""
    graph = {
        "tfhvd.common.elastic": {"tfhvd.runner.elastic.service", "tfhvd.common.util"},
        "tfhvd.tensorflow.functions": {"tfhvd.runner.secret"},
        "tfhvd.tensorflow.data.compute_worker": {"tfhvd.runner.compute_service"},
        "tfhvd.ray.runner": {"tfhvd.spark.runner", "tfhvd.runner.engines"},
        "tfhvd.spark.elastic": {"tfhvd.runner.elastic.launch", "tfhvd.runner.elastic.driver"},
        "tfhvd.runner.elastic.api": {"tfhvd.runner.elastic.launch"},
        "tfhvd.runner.launch": {"tfhvd.runner.gloo.job"},
        "tfhvd.runner.gloo.job": {"tfhvd.ray"},
    }
    assert common_violations(graph) == ["tfhvd.common.elastic -> tfhvd.runner.elastic.service"]
    assert training_violations(graph) == ["tfhvd.common.elastic -> tfhvd.runner.elastic.service",
                                          "tfhvd.tensorflow.functions -> tfhvd.runner.secret"]
    assert engine_violations(graph) == [
        "tfhvd.ray.runner -> tfhvd.spark.runner (one engine imports the other)",
        "tfhvd.runner.gloo.job -> tfhvd.ray (the launcher imports an engine)",
        "tfhvd.spark.elastic -> tfhvd.runner.elastic.launch (an entry point)",
    ]


TRAINING_PROCESS = r"""
import sys
import tensorflow as tf
import tfhvd.tensorflow as hvd
import tfhvd.keras
import tfhvd.tensorflow.keras
hvd.init()
assert float(hvd.allreduce(tf.constant(2.0))) == 2.0
state = hvd.elastic.ObjectState(epoch=0)
state.commit()
loaded = sorted(m for m in sys.modules if m == "tfhvd.runner" or m.startswith("tfhvd.runner."))
print("RUNNER_MODULES=%s" % ",".join(loaded))
hvd.shutdown()
"""


def test_a_training_process_loads_no_launcher_module():
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("OMPI_", "PMIX_", "HOROVOD_", "TFHVD_")):
            del env[key]
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", TRAINING_PROCESS], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("RUNNER_MODULES=")]
    assert line == ["RUNNER_MODULES="], out.stdout


def test_keras_side_uses_the_async_modes_public_interface():
    """The Keras side of the asynchronous modes (tfhvd/tensorflow/asynchronous/
    keras.py, and the rest of tfhvd/_keras) reaches the TensorFlow side's
    DelayedGradients through its public interface only (scope, has_reduction,
    set_reduction, exchange, flush_pairs, ...), imports no private name of
    another module, and reads the reduction's modes through its declared
    attributes, not ``__dict__``."""
    import ast
    import glob

    import tensorflow as tf  # noqa: F401  (delayed.py builds tf.Modules)

    from tfhvd.tensorflow.asynchronous.delayed import DelayedGradients

    private = {name for name in vars(DelayedGradients(name="probe"))
               if name.startswith("_") and not name.startswith("__")}
    assert {"_reduce_fn", "_positions", "_variables", "_scope"} <= private
    reaches = []
    paths = sorted(glob.glob(os.path.join(ROOT, "tfhvd", "_keras", "*.py")))
    paths.append(os.path.join(ROOT, "tfhvd", "tensorflow", "asynchronous", "keras.py"))
    for path in paths:
        with open(path) as f:
            source = f.read()
        tree, lines = ast.parse(source, path), source.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfhvd"):
                reaches.extend("%s:%d imports %s.%s" % (os.path.basename(path), node.lineno,
                                                         node.module, alias.name)
                               for alias in node.names
                               if alias.name.startswith("_") and not alias.name.startswith("__")
                               and path.endswith(os.path.join("asynchronous", "keras.py")))
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id == "self"):
                reaches.append("%s:%d .%s" % (os.path.basename(path), node.lineno, node.attr))
            if isinstance(node, ast.Constant) and node.value in ("delayed", "local_sgd") and \
                    "__dict__" in lines[node.lineno - 1]:
                reaches.append("%s:%d __dict__[%r]" % (os.path.basename(path), node.lineno,
                                                       node.value))
    assert not reaches, "private reaches into the async modes:\n  " + "\n  ".join(reaches)


def test_the_async_modes_have_one_home():
    """Every piece of the asynchronous modes (the stale pipeline, local SGD and
    their Keras callbacks and hooks) is defined in tfhvd/tensorflow/asynchronous/
    and nowhere else."""
    import ast
    import glob

    pieces = {"DelayedGradients", "LocalSGD", "LocalSGDImpl", "LocalAveraging",
              "DelayedGradientsCallbackImpl", "check_staleness", "check_local_sgd_arguments",
              "average_variables", "attach_delayed", "flush_optimizer", "tape_gradients"}
    home = os.path.join(ROOT, "tfhvd", "tensorflow", "asynchronous") + os.sep
    found: dict = {}
    for path in glob.glob(os.path.join(ROOT, "tfhvd", "**", "*.py"), recursive=True):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in pieces:
                found.setdefault(node.name, []).append(os.path.relpath(path, ROOT))
    assert set(found) == pieces, sorted(pieces - set(found))
    outside = {name: paths for name, paths in found.items()
               if any(not os.path.join(ROOT, p).startswith(home) for p in paths)}
    assert not outside, outside
