"""Local SGD / periodic model averaging (post-local SGD, Lin et al., ICLR 2020).

Each rank applies its own gradients; every ``period`` steps the weights (and,
optionally, the optimizer's slots) are averaged across ranks with one grouped
allreduce.  The first ``warmup_steps`` steps are synchronous: gradients are
averaged as with ``DistributedGradientTape``.  ``period=1`` is synchronous
training (the same gradient allreduce every step, no weight averaging).

Custom loop::

    local_sgd = hvd.LocalSGD(period=4, warmup_steps=100)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = local_sgd.reduce_gradients(tape.gradient(loss, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        local_sgd.step(model.trainable_variables, opt)   # averages when due

Keras ``fit``: the ``hvd.LocalSGD`` of ``tfhvd.keras`` / ``tfhvd.tensorflow.keras``
is a callback (see ``tfhvd.tensorflow.asynchronous.keras``).
"""

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.common.process_sets import process_set_reduces
from tfhvd.tensorflow.gradient_tape import grouped_allreduce
from tfhvd.tensorflow.mpi_ops import Average

_INSTANCES = [0]  # same creation order on every rank: names of the collectives


def check_local_sgd_arguments(period: Any, warmup_steps: Any) -> None:
    """Raises ValueError for a ``period`` < 1 or ``warmup_steps`` < 0 (or non-integers)."""
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError("LocalSGD: period must be an integer >= 1 (1 is synchronous "
                         "training); got %r" % (period,))
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError("LocalSGD: warmup_steps must be an integer >= 0; got %r"
                         % (warmup_steps,))


def averaged_variables(variables: Sequence[Any]) -> List[Any]:
    """The floating-point variables of ``variables`` (what averaging touches)."""
    out = []
    seen = set()
    for v in variables:
        if v is None or id(v) in seen:
            continue
        seen.add(id(v))
        if tf.as_dtype(v.dtype).is_floating:
            out.append(v)
    return out


def optimizer_slots(optimizer: Any) -> List[Any]:
    """An optimizer's floating-point state, without its learning rate and step count."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    variables = inner.variables
    if callable(variables):  # tf-keras OptimizerV2: a method
        variables = variables()
    out = []
    for v in variables:
        name = str(getattr(v, "path", None) or getattr(v, "name", ""))
        if "learning_rate" in name or "iteration" in name:
            continue
        out.append(v)
    return averaged_variables(out)


def average_variables(variables: Sequence[Any], process_set: ProcessSet = global_process_set,
                      name: Optional[str] = None) -> Any:
    """Replaces each floating-point variable by its average over ``process_set``
    (one grouped allreduce).  A no-op on a rank outside the set, or with one rank."""
    todo = averaged_variables(variables)
    if not todo or not process_set_reduces(process_set):
        return tf.no_op()
    values = [tf.convert_to_tensor(v) for v in todo]
    averaged = grouped_allreduce(values, op=Average, process_set=process_set, name=name)
    assigns = [v.assign(a) for v, a in zip(todo, averaged, strict=True)]
    return tf.group(*[a for a in assigns if a is not None]) if not tf.executing_eagerly() \
        else tf.no_op()


class LocalSGD(tf.Module):
    """Periodic model averaging for custom training loops (see the module docstring).

    Args:
      period: average the weights every this many steps after the warm-up
        (1: synchronous training, gradients averaged every step).
      warmup_steps: this many first steps are synchronous (gradients averaged).
      average_optimizer_state: also average the optimizer's floating-point
        slots (momenta, Adam's moments) at each averaging step.
      process_set: average over this ``hvd.ProcessSet``; ranks outside it
        train alone.

    The step count is the variable ``steps`` (tracked: put this object in a
    ``tf.train.Checkpoint`` or an elastic state to resume the schedule).
    Weights are identical on every rank right after an averaging step: commit
    an elastic state there.
    """

    def __init__(self, period: int, warmup_steps: int = 0,
                 average_optimizer_state: bool = False,
                 process_set: ProcessSet = global_process_set) -> None:
        check_local_sgd_arguments(period, warmup_steps)
        check_process_set(process_set)
        index = _INSTANCES[0]
        _INSTANCES[0] += 1
        super().__init__(name="tfhvd_local_sgd_%d" % index)
        self.period = period
        self.warmup_steps = warmup_steps
        self.average_optimizer_state = bool(average_optimizer_state)
        self.process_set = process_set
        self._prefix = "LocalSGD%d" % index
        with tf.init_scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")

    def is_synchronous(self) -> Any:
        """Whether the current step averages gradients (a bool tensor, or True)."""
        if self.period == 1:
            return True
        return self.steps < self.warmup_steps

    def reduce_gradients(self, grads: Sequence[Any]) -> List[Any]:
        """``grads`` averaged over the process set while synchronous, else as they are."""
        grads = list(grads)
        idx = [i for i, g in enumerate(grads) if g is not None]
        if not idx or not process_set_reduces(self.process_set):
            return grads
        if self.period > 1 and self.warmup_steps == 0:
            return grads

        def synchronous():
            return grouped_allreduce([grads[i] for i in idx], op=Average,
                                     process_set=self.process_set,
                                     name="%s_Gradients" % self._prefix)

        if self.period == 1:
            reduced = synchronous()
        else:
            reduced = tf.cond(self.steps < self.warmup_steps, synchronous,
                              lambda: [tf.identity(grads[i]) for i in idx])
        for i, r in zip(idx, reduced, strict=True):
            grads[i] = r
        return grads

    def due(self, step: Any) -> Any:
        """Whether the weights are averaged after step number ``step`` (1-based)."""
        after = step - self.warmup_steps
        return tf.logical_and(after > 0, tf.equal(after % self.period, 0))

    def step(self, variables: Sequence[Any], optimizer: Any = None) -> Any:
        """Counts a step; averages ``variables`` (and the optimizer's slots when
        asked) when the step ends a period.  Returns whether it averaged (a bool
        tensor; False with ``period=1``, where nothing needs averaging)."""
        n = self.steps.assign_add(1)
        if self.period == 1:
            return tf.constant(False)
        targets = list(variables)
        if self.average_optimizer_state and optimizer is not None:
            targets += optimizer_slots(optimizer)

        def average():
            with tf.control_dependencies([average_variables(
                    targets, self.process_set, "%s_Average" % self._prefix)]):
                return tf.constant(True)

        return tf.cond(self.due(n), average, lambda: tf.constant(False))

    def average_now(self, variables: Sequence[Any], optimizer: Any = None) -> None:
        """Averages ``variables`` (and slots) now, e.g. at the end of training."""
        targets = list(variables)
        if self.average_optimizer_state and optimizer is not None:
            targets += optimizer_slots(optimizer)
        average_variables(targets, self.process_set, "%s_Final" % self._prefix)
