"""The Keras side of ``hvd.elastic``: ``KerasState`` and the three callbacks,
made once per Keras flavour (Keras 3 or tf-keras) by :func:`elastic_classes`.

* ``CommitStateCallback(state, batches_per_commit=1)`` commits every
  ``batches_per_commit`` batches and at each epoch end;
* ``UpdateBatchStateCallback(state)`` keeps ``state.batch`` = the batches done
  in the current epoch (0 again at the epoch's end), counting those done
  before a reset;
* ``UpdateEpochStateCallback(state)`` keeps ``state.epoch`` = the epochs done,
  across resets (``fit(epochs=total - state.epoch)`` after a reset).

Put them in this order in ``callbacks=[...]``: epoch, batch, commit (as
Horovod's examples do), so that a commit records the updated counters.
"""

from typing import Any, Dict, Optional, Tuple

from tfhvd._keras import flavor as _flavor
from tfhvd.tensorflow.elastic import TensorFlowKerasState

_CLASSES: Dict[str, Dict[str, type]] = {}


class CommitStateCallbackImpl:
    """Commits ``state`` every ``batches_per_commit`` batches and at each epoch end."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError("batches_per_commit must be an integer >= 1, got %r"
                             % (batches_per_commit,))
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Every worker restarts the count after a reset, so they commit together.
        self.batches_remaining = self.batches_per_commit

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    """Keeps ``state.batch`` equal to the batches done in the current epoch.

    With tf-keras and ``steps_per_epoch`` set, the first epoch after a reset
    is shortened by the batches already done (as in Horovod); Keras 3 fixes
    the step count when ``fit`` starts, so there pass a data set for the rest
    of the epoch instead (``hvd.elastic.ElasticDataset.dataset(state)``).
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: Optional[int] = None
        self._start = 0

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.steps_per_epoch = None
        self._start = int(getattr(self.state, "batch", 0) or 0)

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch
        self._start = int(self.state.batch)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = self._start + batch + 1

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0
        self._start = 0


class UpdateEpochStateCallbackImpl:
    """Keeps ``state.epoch`` equal to the epochs done, across resets."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = int(state.epoch)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.initial_epoch = int(self.state.epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        # Keras counts from 0 in every fit(); add the epochs done before.
        self.state.epoch = self.initial_epoch + epoch + 1


def elastic_names(keras_module: Any) -> Tuple[type, type, type, type]:
    """``(KerasState, CommitStateCallback, UpdateBatchStateCallback,
    UpdateEpochStateCallback)`` for a public Keras module."""
    c = elastic_classes(_flavor.flavor_of_module(keras_module))
    return (c["KerasState"], c["CommitStateCallback"], c["UpdateBatchStateCallback"],
            c["UpdateEpochStateCallback"])


def elastic_classes(flavor: str) -> Dict[str, type]:
    """``KerasState`` and the callback classes for a flavour (made once)."""
    classes = _CLASSES.get(flavor)
    if classes is not None:
        return classes
    api = _flavor.public_api(flavor)
    callback = api.callbacks.Callback
    backend = api.backend

    class KerasState(TensorFlowKerasState):
        """The state of a Keras model and optimizer plus keyword values
        (``hvd.elastic.KerasState(model, batch=0, epoch=0)``)."""

        def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
            super().__init__(model, optimizer=optimizer, backend=backend, **kwargs)

    KerasState.__module__ = __name__
    KerasState.__qualname__ = "KerasState"
    classes = {"KerasState": KerasState}
    for impl in (CommitStateCallbackImpl, UpdateBatchStateCallbackImpl,
                 UpdateEpochStateCallbackImpl):
        name = impl.__name__[:-len("Impl")]
        classes[name] = type(name, (impl, callback), {"__module__": __name__,
                                                       "__qualname__": name,
                                                       "__doc__": impl.__doc__})
    _CLASSES[flavor] = classes
    return classes
