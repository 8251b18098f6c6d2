"""The ``DistributedOptimizer`` parameters, defined once.

Horovod spells ``DistributedOptimizer`` in several modules with the same
parameters in different orders (``horovod.tensorflow``,
``horovod.tensorflow.keras``, ``horovod.keras``, and their
``PartialDistributedOptimizer``), and scripts pass them by position.  Here each
parameter has one default (:class:`OptimizerOptions`), and each public function
is made by :func:`horovod_signature` from an order: the names it takes by
position, then the names it takes by keyword only.  The implementation receives
the optimizer and one :class:`OptimizerOptions`, never a long parameter list.
"""

import dataclasses
import inspect
import warnings
from typing import Any, Callable, Optional, Sequence

from tfhvd.common.basics import ProcessSet, global_process_set
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.mpi_ops import Average


@dataclasses.dataclass(frozen=True)
class OptimizerOptions:
    """Every option of a ``DistributedOptimizer``, with Horovod's defaults.

    ``device_dense``/``device_sparse`` are accepted for Horovod compatibility
    and unused; ``use_locking`` applies to TF1 optimizers only; ``local_layers``
    to ``PartialDistributedOptimizer``; ``staleness`` is tfhvd's (docs/async.md).
    """

    name: Optional[str] = None
    use_locking: bool = False
    device_dense: str = ""
    device_sparse: str = ""
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    backward_passes_per_step: int = 1
    average_aggregated_gradients: bool = False
    op: int = Average
    gradient_predivide_factor: float = 1.0
    num_groups: int = 0
    groups: Any = None
    process_set: ProcessSet = global_process_set
    local_layers: Any = None
    scale_local_gradients: bool = True
    staleness: int = 0

    @property
    def fusion_groups(self) -> Any:
        """``groups``, or Horovod's older ``num_groups`` when ``groups`` is unset
        (None: one fused reduction), checked by :func:`checked_groups`."""
        return checked_groups(self.groups, self.num_groups)


def checked_groups(groups: Any, num_groups: Any = 0) -> Any:
    """Horovod's ``groups`` (or its deprecated ``num_groups``), checked as Horovod does.

    Returns None (one fused reduction), a positive int (that many groups) or the
    list of lists of variables.  ``num_groups`` warns (DeprecationWarning) and
    stands for ``groups`` when that is unset; 0, a negative or a non-integer
    number, or anything else is a ValueError naming what was given."""
    if num_groups is not None and not (isinstance(num_groups, int) and num_groups == 0):
        warnings.warn("num_groups has been replaced by groups", DeprecationWarning,
                      stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, (list, tuple)) and all(isinstance(g, (list, tuple)) for g in groups):
        return groups
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        return groups
    raise ValueError("groups must be a positive integer (that many fused reductions) or a "
                     "list of lists of tf.Variable; got %r" % (groups,))


_FIELDS = {f.name: f for f in dataclasses.fields(OptimizerOptions)}


def horovod_signature(positional: Sequence[str], keyword_only: Sequence[str] = ()
                      ) -> Callable[[Callable[[Any, OptimizerOptions], Any]], Callable[..., Any]]:
    """Makes ``impl(optimizer, options)`` a function with Horovod's parameters.

    The result takes ``optimizer`` then ``positional`` (by position or keyword)
    then ``keyword_only``; every name is a field of :class:`OptimizerOptions`
    with its default.  It binds a call as Python would (an unknown or repeated
    argument is Python's own TypeError) and calls ``impl`` with the options.
    ``inspect.signature`` shows the order, for users and help().
    """
    for name in list(positional) + list(keyword_only):
        if name not in _FIELDS:
            raise ValueError("not a DistributedOptimizer option: %r" % name)
    params = [inspect.Parameter("optimizer", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=Any)]
    for kind, names in ((inspect.Parameter.POSITIONAL_OR_KEYWORD, positional),
                        (inspect.Parameter.KEYWORD_ONLY, keyword_only)):
        params += [inspect.Parameter(n, kind, default=_FIELDS[n].default,
                                     annotation=_FIELDS[n].type) for n in names]
    signature = inspect.Signature(params, return_annotation=Any)

    def decorate(impl: Callable[[Any, OptimizerOptions], Any]) -> Callable[..., Any]:
        def public(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            values = dict(bound.arguments)
            optimizer = values.pop("optimizer")
            return impl(optimizer, OptimizerOptions(**values))

        for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
            setattr(public, attr, getattr(impl, attr))
        public.__signature__ = signature  # type: ignore[attr-defined]
        return public

    return decorate
