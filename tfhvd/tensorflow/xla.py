"""tfhvd's collectives inside XLA-compiled functions: a clear error at trace time.

tfhvd's collectives are asynchronous TensorFlow kernels; XLA has no lowering
for them (tfhvd builds no XLA custom call).  Left alone, a
``tf.function(jit_compile=True)`` holding one fails when it first runs, with
TensorFlow's "Detected unsupported operations when trying to compile graph"
message, which names neither the function nor a way out.  Every collective
therefore checks, when it is added to a graph, whether that graph is being
traced for XLA, and raises :class:`XlaCollectiveError` naming the function.

Keras ``fit`` does not meet this error: with a ``DistributedOptimizer`` and
``jit_compile`` on, tfhvd splits the train step into compiled functions with
the gradient reduction between them (``tfhvd._keras.xla_split``).
"""

from typing import Optional

from tensorflow.python.framework import ops as tf_ops
from tensorflow.python.ops import control_flow_util

WORKAROUND = (
    "Compile the computation before and after the collective as separate "
    "tf.function(jit_compile=True) functions and call them, with the collective "
    "between them, from a tf.function without jit_compile (the collective then runs "
    "outside XLA); or drop jit_compile=True from that function.  Keras fit with "
    "hvd.DistributedOptimizer does this split itself (docs/keras.md, 'XLA').")


class XlaCollectiveError(ValueError):
    """A tfhvd collective was added to a function that XLA compiles."""

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


def check_not_compiled(kind: str, name: Optional[str] = None) -> None:
    """Raises :class:`XlaCollectiveError` when a ``kind`` collective (e.g. ``allreduce``)
    is being added to a function that XLA compiles.  Costs a few attribute reads
    per graph level, once per op at trace time."""
    function = compiled_function_name()
    if function is None:
        return
    what = "tfhvd %s%s" % (kind, " '%s'" % name if name else "")
    raise XlaCollectiveError(
        "%s is inside the tf.function '%s', which is compiled with XLA (jit_compile=True); "
        "XLA cannot compile tfhvd's collectives.  %s" % (what, function, WORKAROUND))
