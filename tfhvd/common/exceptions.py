"""Exceptions raised by tfhvd, with Horovod's names (``horovod.common.exceptions``)."""


class HorovodInternalError(RuntimeError):
    """A collective failed inside the runtime (a peer left, the transport failed).

    The counterpart of Horovod's ``HorovodInternalError``: code that catches it to
    restart or re-initialise keeps working.  ``TfhvdInternalError`` is the same class.

    TensorFlow ops cannot raise a Python class of their own: a collective that fails
    this way raises ``tf.errors.UnknownError`` (Horovod's class for it, from its
    ``SHUT_DOWN_ERROR``).  :func:`is_internal_error` recognises those errors and
    :func:`internal_error_from` turns one into this class, as Horovod's
    ``horovod.tensorflow.elastic.run`` does.
    """


TfhvdInternalError = HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """The launcher's set of hosts changed (Horovod's class of the same name): every
    worker raises this at the same commit, so that the job can re-form with the new hosts.

    ``skip_sync`` is True when hosts were only removed: the survivors already
    hold the same state, so ``hvd.elastic.run`` does not broadcast it again
    (unless the new world has newcomers after all).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the set of hosts of this elastic job changed")
        self.skip_sync = skip_sync


class NotInitializedError(ValueError):
    """An API that needs the runtime was called before ``hvd.init()``."""

    def __init__(self) -> None:
        super().__init__("tfhvd has not been initialized; call hvd.init() first")


# Prefixes of every message the runtime writes when a collective fails because
# the runtime shut down, a peer left or stalled, or the transport failed.
_INTERNAL_MARKERS = ("tfhvd", "Horovod")


def is_internal_error(exc: BaseException) -> bool:
    """Whether ``exc`` means a collective failed inside the runtime.

    True for :class:`HorovodInternalError` and for the ``tf.errors.UnknownError``
    a tfhvd (or Horovod) op raises when the runtime shut down, a peer exited, lost
    its connection or stalled past the stall-shutdown time, or the transport failed.
    Errors of bad input (``InvalidArgumentError``) and ranks that disagree
    (``FailedPreconditionError``) are not internal errors: retrying cannot fix them.
    """
    if isinstance(exc, HorovodInternalError):
        return True
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - tfhvd needs TensorFlow
        return False
    if not isinstance(exc, tf.errors.UnknownError):
        return False
    message = getattr(exc, "message", None) or str(exc)
    return any(m in message for m in _INTERNAL_MARKERS)


def internal_error_from(exc: BaseException) -> HorovodInternalError:
    """``exc`` as a :class:`HorovodInternalError` (itself when it already is one)."""
    if isinstance(exc, HorovodInternalError):
        return exc
    err = HorovodInternalError(getattr(exc, "message", None) or str(exc))
    err.__cause__ = exc
    return err


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "NotInitializedError",
           "TfhvdInternalError", "internal_error_from", "is_internal_error"]
