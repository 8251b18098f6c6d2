"""GPU tests: run when TensorFlow sees a GPU and the library was built with
NCCL (``make gpu-build``).

On a machine without a GPU every test is skipped with the reason.  On a
machine with one (``nvidia-smi -L`` works or /dev/nvidiactl exists) they
FAIL instead when TensorFlow sees no GPU or the library lacks NCCL: a broken
GPU path must not pass as "skipped".

One process: ``pytest tests/gpu``.  Several, one GPU each:
``mpirun -np <GPUs> tests/parallel/run_rank.sh python -m pytest tests/gpu``
(``make test-gpu`` does both).  Each process uses the GPU of its local rank.
"""

import os
import shutil
import subprocess

import pytest


def gpu_machine() -> bool:
    """Whether this machine has an NVIDIA GPU and driver, asked of the
    driver rather than of TensorFlow."""
    if os.path.exists("/dev/nvidiactl"):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def _problem() -> str:
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    reasons = []
    if not tf.config.list_physical_devices("GPU"):
        reasons.append("TensorFlow sees no GPU (%s)" % (
            "a driver is present: is this TensorFlow built with CUDA, are its CUDA wheels "
            "installed (tensorflow[and-cuda])?" if GPU_MACHINE
            else "no NVIDIA driver on this machine"))
    if not hvd.nccl_built():
        reasons.append("this tfhvd library was built without NCCL (rebuild with "
                       "TFHVD_GPU_OPERATIONS=NCCL, e.g. `make gpu-build`)")
    return "; ".join(reasons)


GPU_MACHINE = gpu_machine()
PROBLEM = _problem()


def pytest_collection_modifyitems(config, items):
    if not PROBLEM or GPU_MACHINE:
        return
    marker = pytest.mark.skip(reason="GPU tests skipped: " + PROBLEM)
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(marker)


@pytest.fixture(scope="session", autouse=True)
def hvd_gpu():
    """Initialises tfhvd and pins this process to the GPU of its local rank;
    fails every test on a GPU machine whose GPU path is broken."""
    if PROBLEM:
        if GPU_MACHINE:
            pytest.fail("this machine has a GPU, but the GPU path cannot run: " + PROBLEM,
                        pytrace=False)
        yield None
        return
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    for g in tf.config.get_visible_devices("GPU"):
        tf.config.experimental.set_memory_growth(g, True)
    yield hvd
