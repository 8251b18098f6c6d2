"""The DistributedOptimizer parameters are defined once
(tfhvd/tensorflow/optimizer_options.py) and every public spelling is made from
an order of them: the same defaults everywhere, Horovod's positions kept, and
one options object reaching the implementation."""

import dataclasses
import inspect
import re

import pytest

from tfhvd._keras import api, horovod_api
from tfhvd.tensorflow import legacy_optimizer
from tfhvd.tensorflow.optimizer_options import OptimizerOptions, horovod_signature

SPELLINGS = {
    "tfhvd.tensorflow": legacy_optimizer.DistributedOptimizer,
    "tfhvd._keras.api": api.DistributedOptimizer,
    "tfhvd._keras.api partial": api.PartialDistributedOptimizer,
    "horovod.tensorflow.keras": horovod_api.tf_keras_distributed_optimizer,
    "horovod.keras": horovod_api.keras_distributed_optimizer,
    "horovod.keras partial": horovod_api.partial_distributed_optimizer,
}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(OptimizerOptions)}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_spelling_takes_the_one_table_defaults(spelling):
    params = list(inspect.signature(SPELLINGS[spelling]).parameters.values())
    assert params[0].name == "optimizer"
    for p in params[1:]:
        assert p.name in DEFAULTS, p.name
        assert p.default is DEFAULTS[p.name], (p.name, p.default)


def test_horovod_positions_are_kept():
    """Horovod's orders differ: the same positional call means different things."""
    def order(fn):
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert order(legacy_optimizer.DistributedOptimizer)[:4] == [
        "optimizer", "name", "use_locking", "device_dense"]
    assert order(horovod_api.tf_keras_distributed_optimizer)[5:9] == [
        "sparse_as_dense", "gradient_predivide_factor", "op", "backward_passes_per_step"]
    assert order(horovod_api.keras_distributed_optimizer)[-2:] == ["num_groups", "groups"]


def test_a_call_reaches_the_implementation_as_one_options_object():
    seen = []

    @horovod_signature(("name", "op", "groups"), ("staleness",))
    def impl(optimizer, options):
        """doc"""
        seen.append((optimizer, options))
        return "made"

    assert impl("opt", "n", 7, groups=2, staleness=1) == "made"
    optimizer, options = seen[0]
    assert optimizer == "opt" and isinstance(options, OptimizerOptions)
    assert (options.name, options.op, options.groups, options.staleness) == ("n", 7, 2, 1)
    assert options.compression is DEFAULTS["compression"]
    assert impl.__doc__ == "doc" and impl.__name__ == "impl"
    with pytest.raises(TypeError, match="too many positional arguments"):
        impl("opt", "n", 7, 2, 1)  # keyword-only stays keyword-only
    with pytest.raises(TypeError, match="bogus"):
        impl("opt", bogus=1)
    with pytest.raises(ValueError, match="not a DistributedOptimizer option: 'bogus'"):
        horovod_signature(("bogus",))


def test_num_groups_is_the_older_spelling_of_groups():
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert OptimizerOptions(num_groups=3).fusion_groups == 3
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert OptimizerOptions(groups=2, num_groups=3).fusion_groups == 2
    assert OptimizerOptions().fusion_groups is None


@pytest.mark.parametrize("groups", [0, -1, 2.5, True, "2", [1, 2]])
def test_groups_that_are_not_a_positive_int_or_lists_are_refused_everywhere(groups):
    """Horovod: "groups should be a non-negative integer or a list of list of
    tf.Variable" (0 included); tfhvd made them one group without a word."""
    import keras
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()  # the Keras wrapper needs it; init is idempotent for the tests after this
    makers = [lambda: hvd.DistributedGradientTape(tf.GradientTape(), groups=groups),
              lambda: hvd.DistributedOptimizer(
                  tf.compat.v1.train.GradientDescentOptimizer(1.0), groups=groups),
              lambda: hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=groups)]
    for make in makers:
        with pytest.raises(ValueError, match="groups must be a positive integer .* got %s"
                           % re.escape(repr(groups))):
            make()
    for fine in (None, 1, 3, [[]], ([],)):
        hvd.DistributedGradientTape(tf.GradientTape(), groups=fine)
        hvd.DistributedOptimizer(keras.optimizers.SGD(), groups=fine)
