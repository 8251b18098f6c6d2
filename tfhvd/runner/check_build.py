"""``tfhvdrun --check-build``: what this installation can do, asked of the
compiled library itself rather than assumed.

Horovod's check marks frameworks as built when their Python package merely
imports; here a framework is marked only when tfhvd has a working front end
for it, and the tensor operations come from the library's build flags.
"""

import ctypes.util
import glob
import importlib.util
import os
from dataclasses import dataclass
from typing import List, Optional

from tfhvd.version import __version__


@dataclass
class BuildInfo:
    """What ``--check-build`` reports; ``error`` says why the library could
    not be asked (then nothing is marked built)."""

    version: str
    tensorflow: bool = False
    tensorflow_version: Optional[str] = None
    keras: bool = False
    mpi: bool = False
    gloo: bool = False
    nccl: bool = False
    cuda_built: bool = False
    cuda_driver: bool = False
    gpu_code: str = ""
    gpu_versions: str = ""
    gpu_devices: int = 0
    xla_ops: bool = False
    library: Optional[str] = None
    error: Optional[str] = None


def _cuda_driver_present() -> bool:
    return ctypes.util.find_library("cuda") is not None or os.path.exists("/dev/nvidiactl")


def _gpu_device_count() -> int:
    return len([p for p in glob.glob("/dev/nvidia[0-9]*") if os.path.basename(p)[6:].isdigit()])


def gather() -> BuildInfo:
    """Loads the library (and TensorFlow) and reads its build flags."""
    info = BuildInfo(version=__version__, cuda_driver=_cuda_driver_present(),
                     gpu_devices=_gpu_device_count())
    try:
        from tfhvd.common import basics, library

        library.load()
        info.library = library.library_path()
        info.mpi = basics.mpi_built()
        info.gloo = basics.gloo_built()
        info.nccl = basics.nccl_built()
        info.cuda_built = basics.cuda_built()
        info.gpu_code = basics.gpu_code_info()
        info.gpu_versions = basics.gpu_versions_info()
        info.xla_ops = basics.xla_ops_built()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        info.error = "%s: %s" % (type(e).__name__, e)
        return info
    import tensorflow as tf

    info.tensorflow = True
    info.tensorflow_version = tf.__version__
    # The Keras front end is Python on top of the TF ops: usable when its
    # module is part of this installation and Keras is installed.
    info.keras = (importlib.util.find_spec("keras") is not None
                  and importlib.util.find_spec("tfhvd.keras") is not None)
    return info


def _mark(flag: bool) -> str:
    return "[X]" if flag else "[ ]"


def render(info: BuildInfo) -> str:
    """The report, in horovodrun's layout."""
    lines: List[str] = ["tfhvd v%s:" % info.version, ""]
    if info.error:
        lines += ["The tfhvd library could not be loaded, so nothing is marked built:",
                  "    " + info.error, ""]
    tf_note = " %s" % info.tensorflow_version if info.tensorflow_version else ""
    lines += [
        "Available Frameworks:",
        "    %s TensorFlow%s" % (_mark(info.tensorflow), tf_note),
        "    %s Keras 3 (tfhvd.keras)" % _mark(info.keras),
        "    %s PyTorch" % _mark(False),
        "    %s MXNet" % _mark(False),
        "",
        "Available Controllers:",
        "    %s MPI" % _mark(info.mpi),
        "    %s Gloo" % _mark(info.gloo),
        "",
        "Available Tensor Operations:",
        "    %s NCCL" % _mark(info.nccl),
        "    %s DDL" % _mark(False),
        "    %s CCL" % _mark(False),
        "    %s MPI" % _mark(info.mpi),
        "    %s Gloo" % _mark(info.gloo),
        "",
        "CUDA:",
        "    %s built with CUDA" % _mark(info.cuda_built),
    ] + (["        device code by %s" % info.gpu_code] if info.gpu_code else []) + (
        ["        %s" % info.gpu_versions] if info.gpu_versions else []) + [
        "    %s CUDA driver present on this machine (%d GPU device%s)" % (
            _mark(info.cuda_driver), info.gpu_devices, "" if info.gpu_devices == 1 else "s"),
        "",
        "XLA:",
        "    %s XLA ops (an allreduce inside tf.function(jit_compile=True), CPU)"
        % _mark(info.xla_ops),
    ]
    if info.library:
        lines += ["", "Library: %s" % info.library]
    return "\n".join(lines)


def check_build() -> str:
    """The ``--check-build`` report for this installation."""
    return render(gather())
