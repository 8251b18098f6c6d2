"""Horovod's ``horovod.tensorflow.util`` helpers that ``horovod.tensorflow`` re-exports,
and the private ones that Horovod's own test files and programs import
(``from horovod.tensorflow.util import _executing_eagerly``)."""

from typing import Any, Callable, Dict, Tuple

import tensorflow as tf

# Every TensorFlow that tfhvd supports has eager execution.
_has_eager = True


def _executing_eagerly() -> bool:
    """Whether ops run eagerly here (False while a graph or tf.function is built)."""
    return tf.executing_eagerly()


def _make_subgraph(f: Callable) -> Callable:
    """``f`` as a ``tf.function``."""
    return tf.function(f)


def _cache(f: Callable) -> Callable:
    """Memoises ``f`` on its (hashable) positional arguments, separately for eager
    and graph mode, since a graph-mode result belongs to one graph."""
    results: Dict[Tuple[Any, bool], Any] = {}

    def cached(*args: Any) -> Any:
        key = (args, tf.executing_eagerly())
        if key not in results:
            results[key] = f(*args)
        return results[key]

    return cached


def vars_to_refs(vars: Any) -> Any:  # noqa: A002 (Horovod's name)
    """A variable's ``ref()`` (a hashable key), or a tuple of them for a (nested) list."""
    if isinstance(vars, list):
        return tuple(vars_to_refs(v) for v in vars)
    if not hasattr(vars, "ref"):
        raise TypeError("vars_to_refs takes tf.Variable objects (or lists of them), got %r; "
                        "Keras 3 variables have no ref(): use their .value" % (vars,))
    return vars.ref()


def refs_to_vars(refs: Any) -> Any:
    """The inverse of :func:`vars_to_refs`: a tuple of refs gives a list of variables."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
