"""The asynchronous modes, in one place: ``staleness=1`` and local SGD.

Both modes change *when* gradients (or weights) are reduced, never how; the
collectives underneath are the ordinary ones of :mod:`tfhvd.tensorflow`.

Modules:
  delayed    :class:`DelayedGradients`, the one-step-stale pipeline (TensorFlow
             side): ``hvd.DistributedGradientTape(tape, staleness=1)`` and custom
             loops use it directly.
  local_sgd  :class:`LocalSGD`, periodic weight averaging (TensorFlow side):
             ``hvd.LocalSGD`` of ``tfhvd.tensorflow`` for custom loops.
  keras      the Keras side: the reduction hook of ``DistributedOptimizer(...,
             staleness=1)``, the ``DelayedGradientsCallback`` and the
             ``hvd.LocalSGD`` callback of ``tfhvd.keras`` / ``tfhvd.tensorflow.keras``.

The interface between the two sides is public and small; the Keras side uses
nothing else (``tests/single/test_import_rules.py`` checks it):

* ``DelayedGradients``: ``scope``, ``has_reduction()``, ``set_reduction(fn)``,
  ``exchange(grads, variables)``, ``settle()``, ``flush()``, ``flush_pairs()``,
  ``close()``, ``buffers``; ``check_staleness(value)``.
* ``local_sgd``: ``check_local_sgd_arguments(period, warmup_steps)``,
  ``average_variables(variables, process_set, ...)``, ``optimizer_slots(opt)``.
* From the Keras reduction (``tfhvd._keras.reduction.GradientReduction``) the
  Keras side reads only the declared attributes ``delayed`` and ``local_sgd``,
  and scales with ``scaled_gradient``.

The options of both modes travel in the one options object of
``DistributedOptimizer`` (:class:`tfhvd.tensorflow.optimizer_options.OptimizerOptions`).

This ``__init__`` imports nothing: ``tfhvd.tensorflow`` imports ``delayed`` and
``local_sgd``, the Keras layer imports ``keras``, and ``gradient_tape`` reaches
``delayed`` without loading the other two.
"""
