"""tf-keras DistributedOptimizer's compute_gradients path (Horovod's
``_compute_gradients``, ``compute_gradients``, ``_agg_helper`` with
backward_passes_per_step in a ``tf.function`` loop), run as a 2-rank MPI job
of its own under ``TF_USE_LEGACY_KERAS=1`` (see legacy_compute_job.py)."""

import os
import shutil
import subprocess
import sys

import pytest

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_compute_job.py")
CHECKS = ["aggregation_average", "aggregation_sum", "local_vars_average", "local_vars_sum",
          "inf_gradient", "sum_reduced_once",
          "partial_local_layers", "fit_path"]


def test_compute_gradients_path_at_np_2():
    pytest.importorskip("tf_keras", reason="tf-keras is not installed")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TFHVD_GLOO"))}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               TFHVD_STALL_CHECK_TIME_SECONDS="20", TFHVD_STALL_SHUTDOWN_TIME_SECONDS="60")
    cmd = [mpirun, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["-np", "2", sys.executable, JOB]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for name in CHECKS:
        assert out.count("CHECK %s ok" % name) == 2, "%s did not pass on both ranks:\n%s" % (
            name, out[-6000:])
