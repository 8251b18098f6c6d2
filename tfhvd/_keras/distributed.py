"""Telling tfhvd's distributed optimizers apart from Keras's own.

:mod:`tfhvd._keras.optimizer` builds the distributed optimizer classes on
:class:`DistributedOptimizerBase`; the Keras patches, the asynchronous modes
and the public API ask :func:`is_distributed` and :func:`reduction_of` here,
so none of them needs to import the module that builds the classes (which
imports them).
"""

from typing import Any, Optional

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.reduction import GradientReduction


class DistributedOptimizerBase:
    """The base of every distributed optimizer class ``DistributedOptimizer``
    makes (one subclass per wrapped optimizer class, both Keras flavours)."""


def is_distributed(opt: Any) -> bool:
    """Whether ``opt`` (or the inner optimizer of a LossScaleOptimizer) is distributed."""
    if opt is None or isinstance(opt, str):
        return False
    return isinstance(_flavor.inner_optimizer(opt), DistributedOptimizerBase)


def reduction_of(opt: Any) -> Optional[GradientReduction]:
    """The :class:`GradientReduction` of a distributed optimizer, else None."""
    if not is_distributed(opt):
        return None
    return _flavor.inner_optimizer(opt)._tfhvd
