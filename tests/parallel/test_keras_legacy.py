"""Legacy tf-keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``): the shared Keras checks.

One process cannot hold Keras 3 and tf-keras as ``tf.keras`` at once, so rank 0
starts ``keras_legacy_job.py`` as a separate MPI job of the same size (with the
Open MPI variables of this job removed from its environment) while the other
ranks wait in a non-blocking barrier that sleeps, leaving the CPUs to the job.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import tfhvd.keras as hvd

hvd.init()

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_legacy_job.py")
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "HYDRA_", "OPAL_", "PRTE_")


def _run_job(size: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               TFHVD_STALL_CHECK_TIME_SECONDS="20", TFHVD_STALL_SHUTDOWN_TIME_SECONDS="60")
    if hvd.gloo_enabled():  # the same launcher as this job: tfhvdrun --gloo
        for k in [k for k in env if k.startswith(("HOROVOD_", "TFHVD_GLOO"))]:
            del env[k]
        safe = ["-P"] if sys.flags.safe_path else []  # keep a variant's PYTHONPATH first
        cmd = [sys.executable, *safe, "-m", "tfhvd.runner", "--gloo", "-np", str(size),
               sys.executable, *safe, JOB]
    else:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            return {"rc": -1, "output": "mpirun not found"}
        cmd = [mpirun, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["-np", str(size), sys.executable, JOB]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        return {"rc": proc.returncode, "output": proc.stdout + proc.stderr}
    except subprocess.TimeoutExpired as e:
        return {"rc": -2, "output": "timed out after 600 s\n%s" % (e.stdout or "")}


def test_tf_keras_legacy_job():
    pytest.importorskip("tf_keras", reason="tf-keras is not installed")
    result = _run_job(hvd.size()) if hvd.rank() == 0 else None
    if hvd.gloo_enabled():
        # No MPI here, and a tfhvd collective would trip the stall check
        # while the job runs: the ranks (one host) meet in a file.
        path = os.path.join(tempfile.gettempdir(), "tfhvd-legacy-%s.json"
                            % os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"])
        if hvd.rank() == 0:
            with open(path + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(path + ".tmp", path)
        while not os.path.exists(path):
            time.sleep(0.2)
        with open(path) as f:
            result = json.load(f)
        hvd.barrier()
        if hvd.rank() == 0:
            os.unlink(path)
    else:
        from mpi4py import MPI

        request = MPI.COMM_WORLD.Ibarrier()
        while not request.Test():
            time.sleep(0.1)
        result = MPI.COMM_WORLD.bcast(result, root=0)
    lines = [ln for ln in result["output"].splitlines()
             if ln.startswith(("legacy ", "LEGACY", "  ", "Traceback", "AssertionError"))
             or "Error" in ln]
    assert result["rc"] == 0 and "LEGACY RESULT" in result["output"], "\n".join(lines[-80:])
