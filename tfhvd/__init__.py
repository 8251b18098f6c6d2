"""tfhvd: Horovod-compatible data-parallel training for TensorFlow 2.21+ and Keras 3.

Use it like Horovod::

    import tfhvd.tensorflow as hvd          # or tfhvd.keras / tfhvd.tensorflow.keras
    hvd.init()

``tfhvd.run`` (the launcher's Python API, :func:`tfhvd.runner.run`) is
imported on first use, so ``import tfhvd`` alone imports nothing else and
two threads importing two subpackages at once (``tfhvd.ray`` and
``tfhvd.spark``) do not meet in a half-initialised package.
"""

from typing import Any

from tfhvd.version import __version__

__all__ = ["__version__", "run"]


def __getattr__(name: str) -> Any:
    """``tfhvd.run``, imported when first asked for."""
    if name == "run":
        from tfhvd.runner import run
        return run
    raise AttributeError("module 'tfhvd' has no attribute %r" % name)
