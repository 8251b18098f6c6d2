"""tfhvd's collectives inside XLA-compiled functions.

An allreduce or grouped allreduce inside a ``tf.function(jit_compile=True)``
on the CPU runs as an XLA custom call into tfhvd's runtime (the library's XLA
ops, ``tfhvd_ops/tensorflow/xla_ops.cc``; Horovod's ``HOROVOD_ENABLE_XLA_OPS``,
here on by default).  Every other case would fail when the function first
runs, with TensorFlow's "Detected unsupported operations when trying to
compile graph" message, which names neither the function nor a way out: the
other collectives (XLA has no lowering for them), a GPU machine (the custom
call has a host implementation only), a library built without XLA ops, or
``TFHVD_ENABLE_XLA_OPS=0``.  So every collective checks, when it is added to
a graph, whether that graph is being traced for XLA, and in those cases raises
:class:`XlaCollectiveError` naming the function and the reason.

Keras ``fit`` with a ``DistributedOptimizer`` and ``jit_compile`` on splits
the train step into compiled functions with the gradient reduction between
them (``tfhvd._keras.xla_split``), on every device.
"""

from typing import List, Optional

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

WORKAROUND = (
    "Compile the computation before and after the collective as separate "
    "tf.function(jit_compile=True) functions and call them, with the collective "
    "between them, from a tf.function without jit_compile (the collective then runs "
    "outside XLA); or drop jit_compile=True from that function.  Keras fit with "
    "hvd.DistributedOptimizer does this split itself (docs/keras.md, 'XLA').")


class XlaCollectiveError(ValueError):
    """A tfhvd collective (or size, rank op) was added to a function that XLA
    compiles and cannot run there."""

    # AutoGraph re-raises errors from converted code as its own StagingError,
    # message and all, unless told to let them through: keep the type and words.
    ag_pass_through = True


def compiled_function_name(graph: Optional[tf_ops.Graph] = None) -> Optional[str]:
    """The name of the ``jit_compile=True`` function being traced, or None.

    ``tf.function(jit_compile=True)`` enters an ``XLAControlFlowContext`` in the
    graph that calls it (the eager context's graph, or an outer function's)
    and traces its body as a child ``FuncGraph``; traced through
    ``get_concrete_function`` instead, the context is entered in the body's own
    graph.  Walking from ``graph`` out through ``outer_graph``, the compiled
    function is the first graph found in that context, or, when that graph is
    a caller, its child on the walk.
    """
    graph = tf_ops.get_default_graph() if graph is None else graph
    child = None
    while graph is not None:
        if control_flow_util.InXlaContext(graph):
            return _function_label(child if child is not None else graph)
        child = graph
        graph = getattr(graph, "outer_graph", None)
    return None


def _function_label(graph: tf_ops.Graph) -> str:
    return str(getattr(graph, "name", None) or "?")


# The collectives the library's XLA ops lower (HorovodAllreduce,
# HorovodGroupedAllreduce).
XLA_KINDS = ("allreduce", "grouped_allreduce")
_why_not: List[Optional[str]] = []  # decided once per process

# The ops that read the job's shape when they run: no XLA lowering, and a
# different way out than the collectives'.
INFO_KINDS = ("size_op", "local_size_op", "rank_op", "local_rank_op", "process_set_included_op")
INFO_WORKAROUND = (
    "Use hvd.size(), hvd.rank(), hvd.local_size(), hvd.local_rank() or "
    "process_set.included() there instead (Python values, fixed when the function is "
    "traced), or run the op outside the compiled function and pass its value in.")


@tf.autograph.experimental.do_not_convert
def xla_ops_refusal() -> Optional[str]:
    """Why an allreduce cannot run inside an XLA-compiled function in this
    process, or None when it can (the library has XLA ops, the setting allows
    them and no GPU is visible).  Decided once."""
    if not _why_not:
        from tfhvd.common import basics
        if not basics.xla_ops_built():
            why = (
                "this tfhvd library was built without XLA ops (they need TensorFlow 2.21 "
                "or newer, and Debian's libhighwayhash-dev and libfarmhash-dev for its XLA "
                "headers: install those and rebuild; tfhvdrun --check-build says which)")
        elif basics.settings().get("enable_xla_ops") != "1":
            why = "TFHVD_ENABLE_XLA_OPS (or HOROVOD_ENABLE_XLA_OPS) is 0"
        elif tf.config.list_physical_devices("GPU"):
            why = "tfhvd's XLA ops run on the CPU only, and this machine has a GPU"
        else:
            why = None
        _why_not.append(why)
    return _why_not[0]


@tf.autograph.experimental.do_not_convert
def check_not_compiled(kind: str, name: Optional[str] = None) -> None:
    """Raises :class:`XlaCollectiveError` when a ``kind`` collective (e.g. ``allreduce``)
    is being added to a function that XLA compiles and cannot run there
    (:func:`xla_ops_refusal`).  Costs a few attribute reads per graph level, once
    per op at trace time."""
    function = compiled_function_name()
    if function is None:
        return
    if kind in XLA_KINDS:
        why = xla_ops_refusal()
        if why is None:
            return  # an XLA custom call (xla_ops.cc)
    elif kind in INFO_KINDS:
        raise XlaCollectiveError(
            "tfhvd %s is inside the tf.function '%s', which is compiled with XLA "
            "(jit_compile=True); XLA cannot compile it: it reads the job's shape when it "
            "runs, and XLA has no op for that.  %s" % (kind, function, INFO_WORKAROUND))
    else:
        why = "only allreduce and grouped_allreduce have XLA ops"
    what = "tfhvd %s%s" % (kind, " '%s'" % name if name else "")
    raise XlaCollectiveError(
        "%s is inside the tf.function '%s', which is compiled with XLA (jit_compile=True); "
        "XLA cannot compile it here: %s.  %s" % (what, function, why, WORKAROUND))
