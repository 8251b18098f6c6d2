"""Exceptions raised by tfhvd."""


class HorovodInternalError(RuntimeError):
    """A collective failed inside the runtime (a peer left, the transport failed).

    The counterpart of Horovod's ``HorovodInternalError``: code that catches it to
    restart or re-initialise keeps working.  ``TfhvdInternalError`` is the same class.
    """


TfhvdInternalError = HorovodInternalError


class NotInitializedError(ValueError):
    """An API that needs the runtime was called before ``hvd.init()``."""

    def __init__(self) -> None:
        super().__init__("tfhvd has not been initialized; call hvd.init() first")
