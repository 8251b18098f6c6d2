"""tfhvd: Horovod-compatible data-parallel training for TensorFlow 2.21+ and Keras 3.

Use it like Horovod::

    import tfhvd.tensorflow as hvd          # or tfhvd.keras / tfhvd.tensorflow.keras
    hvd.init()
"""

from tfhvd.runner import run
from tfhvd.version import __version__

__all__ = ["__version__", "run"]
