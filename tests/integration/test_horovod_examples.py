"""Horovod's own examples/tensorflow2 scripts run to completion on 2 ranks with
only their import changed (copies in horovod_examples/, see each file's header).

All four call APIs that Keras 3 rejects (``compile(experimental_run_tf_function=
False)``, ``optimizer.variables()``), so they run as Horovod's users run them
today, under tf-keras (``TF_USE_LEGACY_KERAS=1``).  The MNIST scripts get
bundled MNIST-shaped data and a step cap from the _local_data shim; the
benchmarks take a small model and step counts as flags.
"""

import os
import sys

import pytest

from jobs import clean_env, launch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_examples")
BENCH = ["--model", "MobileNetV2", "--batch-size", "2", "--num-batches-per-iter", "1",
         "--num-iters", "2", "--no-cuda"]
CASES = [
    ("tensorflow2_mnist.py", [], ["Step #0\tLoss:"]),
    ("tensorflow2_keras_mnist.py", [], ["Epoch 2/2"]),
    ("tensorflow2_synthetic_benchmark.py", BENCH + ["--num-warmup-batches", "1"],
     ["Total img/sec on 2 CPU(s)"]),
    ("tensorflow2_keras_synthetic_benchmark.py", BENCH, ["Total img/sec on 2 CPU(s)"]),
]


@pytest.mark.parametrize("script,args,says", CASES, ids=[c[0] for c in CASES])
def test_horovod_example_runs(script, args, says, tmp_path):
    env = clean_env({"TF_USE_LEGACY_KERAS": "1", "TFHVD_EXAMPLE_MAX_STEPS": "3",
                     "TFHVD_EXAMPLE_MAX_EPOCHS": "2"})
    job = launch(["-np", "2", sys.executable, os.path.join(HERE, script)] + args,
                 env=env, cwd=str(tmp_path), timeout=420)
    assert job.rc == 0, job.explain()
    for text in says:
        assert text in job.output, job.explain()
    if script == "tensorflow2_keras_mnist.py":
        assert (tmp_path / "checkpoint-2.h5").exists(), job.explain()  # rank 0's checkpoints
    if script == "tensorflow2_mnist.py":
        assert any(p.name.startswith("checkpoints") for p in tmp_path.iterdir()), job.explain()
