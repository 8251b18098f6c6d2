"""GPU tests: run when TensorFlow sees a GPU and the library was built with
NCCL (``make gpu-build``), otherwise every test is skipped with the reason.

One process: ``pytest tests/gpu``.  Several, one GPU each:
``mpirun -np <GPUs> tests/parallel/run_rank.sh python -m pytest tests/gpu``
(``make test-gpu`` does both).  Each process uses the GPU of its local rank.
"""

import os

import pytest


def _skip_reason():
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    reasons = []
    if not tf.config.list_physical_devices("GPU"):
        driver = os.path.exists("/dev/nvidiactl")
        reasons.append("TensorFlow sees no GPU (%s)" % (
            "a driver is present: is this TensorFlow built with CUDA?" if driver
            else "no NVIDIA driver on this machine"))
    if not hvd.nccl_built():
        reasons.append("this tfhvd library was built without NCCL (rebuild with "
                       "TFHVD_GPU_OPERATIONS=NCCL, e.g. `make gpu-build`)")
    return "; ".join(reasons)


SKIP_REASON = _skip_reason()


def pytest_collection_modifyitems(config, items):
    if not SKIP_REASON:
        return
    marker = pytest.mark.skip(reason="GPU tests skipped: " + SKIP_REASON)
    for item in items:
        if "tests/gpu" in str(item.fspath):
            item.add_marker(marker)


@pytest.fixture(scope="session", autouse=True)
def hvd_gpu():
    """Initialises tfhvd and pins this process to the GPU of its local rank."""
    if SKIP_REASON:
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
