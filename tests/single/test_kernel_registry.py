"""Which kernels the library registers, per device, with their host-memory
arguments, read from TensorFlow's kernel registry (no GPU needed).

Every build registers the kernels that touch no device memory (topology
queries, join, barrier) for GPUs too, with host-memory outputs, as Horovod
does: a TF1 graph that pins them under ``tf.device('/gpu:0')`` without soft
placement must find them.  A NCCL build (``make gpu-build``; ``make
test-gpu-build`` runs this file against it) also registers the collectives
for GPUs, with alltoall's splits in host memory.  The test names contain
"gpu" so that ``test-gpu-build``'s ``-k gpu`` selection runs them.
"""

from typing import Dict, List

import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

import tfhvd.common.library as library
import tfhvd.tensorflow as hvd

# op -> its host-memory arguments on a GPU, for every build.
DEVICE_FREE = {
    "HorovodSize": ["size"],
    "HorovodRank": ["rank"],
    "HorovodLocalSize": ["local_size"],
    "HorovodLocalRank": ["local_rank"],
    "HorovodProcessSetIncluded": ["included"],
    "HorovodJoin": ["output"],
    "HorovodBarrier": [],
}
# op -> its host-memory arguments on a GPU, in a NCCL build with every op.
COLLECTIVES = {
    # hvd.broadcast_ of TF1 reference and resource variables on a GPU.
    "HorovodBroadcastInplace": [],
    "HorovodBroadcastInplaceResource": ["resources"],
    "HorovodAllreduce": [],
    "HorovodGroupedAllreduce": [],
    "HorovodAllgather": [],
    "HorovodGroupedAllgather": [],
    "HorovodBroadcast": [],
    "HorovodAlltoall": ["splits", "received_splits"],
    "HorovodReducescatter": [],
    "HorovodGroupedReducescatter": [],
}


def registered(op: str) -> Dict[str, List[str]]:
    """device type -> the host-memory arguments of ``op``'s kernel there."""
    tf.load_op_library(library.library_path())
    return {k.device_type: sorted(k.host_memory_arg)
            for k in kernels.get_registered_kernels_for_op(op).kernel}


@pytest.mark.parametrize("op", sorted(DEVICE_FREE))
def test_gpu_registration_of_device_free_kernels(op):
    kinds = registered(op)
    assert "CPU" in kinds, kinds
    assert kinds.get("GPU") == sorted(DEVICE_FREE[op]), (op, kinds)


@pytest.mark.parametrize("op", sorted(COLLECTIVES))
def test_gpu_registration_of_collectives(op):
    kinds = registered(op)
    assert kinds.get("CPU") == [], (op, kinds)
    if not hvd.nccl_built():
        # A CPU build: TensorFlow copies GPU tensors to the CPU kernel and back.
        assert "GPU" not in kinds, (op, kinds)
    else:
        assert kinds.get("GPU") == sorted(COLLECTIVES[op]), (op, kinds)


def test_gpu_versions_are_recorded_and_reported():
    """A NCCL build records the CUDA runtime and NCCL it was built with and
    reports those it runs with, and the driver; check-build prints the line. A
    CPU build has none."""
    import re

    from tfhvd.common import basics
    from tfhvd.runner import check_build

    info = check_build.gather()
    versions = basics.gpu_versions_info()
    assert info.gpu_versions == versions
    if not hvd.nccl_built():
        assert versions == "" and "built with CUDA runtime" not in check_build.render(info)
        return
    # Where TensorFlow finds no CUDA libraries (a CPU machine), its stubs answer
    # the runtime and NCCL queries with an error: "unavailable (reason)".
    found = r"(\d+\.\d+(\.\d+)?|unavailable \([^)]*\))"
    assert re.fullmatch(r"built with CUDA runtime \d+\.\d+, NCCL \d+\.\d+\.\d+; runs with "
                        r"CUDA runtime %s, NCCL %s, CUDA driver (none|\d+\.\d+)" % (found, found),
                        versions), versions
    assert "        " + versions in check_build.render(info).splitlines()
