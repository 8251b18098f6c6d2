"""The TensorFlow error classes tfhvd's Python checks raise, matching Horovod's.

Horovod finds these problems inside its kernels, so its users see
``tf.errors.*`` classes; tfhvd finds them before building the op, with a
clearer message.  Each class below is the TensorFlow class Horovod raises and
also the Python class tfhvd raised before (so ``except ValueError`` keeps
working):

- a collective before ``hvd.init()``: ``tf.errors.FailedPreconditionError``
  (Horovod's ``NOT_INITIALIZED_ERROR``), also ``ValueError``;
- a scalar given to reducescatter, a broadcast root out of range:
  ``tf.errors.InvalidArgumentError``, also ``ValueError``.
"""

import tensorflow as tf

from tfhvd.common.exceptions import NotInitializedError


class NotInitializedOpError(tf.errors.FailedPreconditionError, NotInitializedError):
    """A collective called before ``hvd.init()`` (or after ``hvd.shutdown()``)."""

    def __init__(self) -> None:
        NotInitializedError.__init__(self)
        tf.errors.FailedPreconditionError.__init__(self, None, None, str(self.args[0]))


class InvalidArgumentValueError(tf.errors.InvalidArgumentError, ValueError):
    """Bad input that one rank sees alone, found before the op is built."""

    def __init__(self, message: str) -> None:
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)
