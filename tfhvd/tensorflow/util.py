"""Horovod's ``horovod.tensorflow.util`` helpers that ``horovod.tensorflow`` re-exports."""

from typing import Any


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
