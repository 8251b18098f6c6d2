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


class HostsUpdatedInterrupt(RuntimeError):
    """The launcher's set of hosts changed: every worker raises this at the same
    commit, so that the job can re-form with the new hosts.

    ``skip_sync`` is True when hosts were only removed: the survivors already
    hold the same state, so ``hvd.elastic.run`` does not broadcast it again
    (unless the new world has newcomers after all).
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the set of hosts of this elastic job changed")
        self.skip_sync = skip_sync
