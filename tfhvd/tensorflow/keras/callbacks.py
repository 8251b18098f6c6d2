"""``hvd.callbacks``: the tfhvd Keras callbacks, as Horovod scripts spell them."""

from typing import Optional, Union

import tensorflow as tf

from tfhvd._keras.face import fill_callbacks

__all__ = fill_callbacks(globals(), tf.keras)

_SharedBestModelCheckpoint = globals()["BestModelCheckpoint"]


class BestModelCheckpoint(_SharedBestModelCheckpoint):  # type: ignore[misc,valid-type]
    """``horovod.tensorflow.keras.callbacks.BestModelCheckpoint``: the same
    callback as ``tfhvd.keras``'s, with this module's Horovod parameter order
    (``save_weights_only`` third, where ``horovod.keras`` has none), then
    ``filepath``, which is required.  See ``tfhvd.keras.callbacks.BestModelCheckpoint``."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Optional[str] = None) -> None:
        super().__init__(monitor=monitor, verbose=verbose, mode=mode, save_freq=save_freq,
                         filepath=filepath, save_weights_only=save_weights_only)
