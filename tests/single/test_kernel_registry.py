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

import os
import subprocess
from typing import Dict, List, Tuple

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


# tests/gpu/memory_types_probe.cc, built by make test-gpu-build (any build's
# library can be probed; TFHVD_MEMORY_TYPES_PROBE names another binary).
PROBE = os.environ.get("TFHVD_MEMORY_TYPES_PROBE") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "build-gpu", "memory_types_probe")


def probe_lines() -> Dict[Tuple[str, str], Tuple[str, Dict[str, List[str]]]]:
    """(op, dtype) -> ("kernel"|"none", {"in"/"out": ["arg:H", ...]}) on a GPU."""
    out = subprocess.run([PROBE, library.library_path()], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = {}
    for line in out.stdout.splitlines():
        assert "error=" not in line, line
        op, dtype, kernel, ins, outs = line.split(" ")
        lines[(op, dtype)] = (kernel, {"in": [a for a in ins[len("in="):].split(",") if a],
                                       "out": [a for a in outs[len("out="):].split(",") if a]})
    return lines


def op_dtypes() -> Dict[str, List[str]]:
    """op -> the dtypes (TensorFlow's C++ names) its definition admits; "-" for none."""
    from tensorflow.python.framework import op_def_registry

    tf.load_op_library(library.library_path())
    names = {"float32": "float", "float64": "double", "float16": "half"}
    out = {}
    for name in list(COLLECTIVES) + list(DEVICE_FREE):
        op = op_def_registry.get(name)
        assert op is not None, "the library defines no op %s" % name
        types = [a for a in op.attr if a.type == "type"]
        out[op.name] = ["-"] if not types else [
            names.get(tf.dtypes.as_dtype(t).name, tf.dtypes.as_dtype(t).name)
            for t in types[0].allowed_values.list.type]
    return out


@pytest.mark.skipif(not os.path.exists(PROBE), reason="make test-gpu-build builds "
                    "tests/gpu/memory_types_probe.cc and runs this test")
def test_gpu_kernel_and_argument_memory_for_every_dtype():
    """For every op and every dtype it admits, what TensorFlow's placer computes
    (FindKernelDef, MemoryTypesForNode): a NCCL build has a GPU kernel for each
    dtype, a CPU build only for the device-free ops; exactly the declared
    arguments live in host memory, and an int32 tensor of a collective lives
    in device memory (TensorFlow keeps a GPU kernel's int32 arguments on the
    host only where the kernel says so)."""
    lines = probe_lines()
    dtypes = op_dtypes()
    expected = dict(COLLECTIVES, **DEVICE_FREE)
    assert {op for op, _ in lines} == set(expected), sorted({op for op, _ in lines} ^
                                                           set(expected))
    wrong = []
    for op, host_args in sorted(expected.items()):
        for dtype in dtypes[op]:
            kernel, memory = lines.get((op, dtype), ("missing", {"in": [], "out": []}))
            want_kernel = "kernel" if hvd.nccl_built() or op in DEVICE_FREE else "none"
            if kernel != want_kernel:
                wrong.append("%s %s: %s on a GPU, expected %s" % (op, dtype, kernel, want_kernel))
            if kernel != "kernel":
                continue
            for side in ("in", "out"):
                for arg in memory[side]:
                    name, where = arg.split(":")
                    want = "H" if name in host_args else "D"
                    if where != want:
                        wrong.append("%s %s: %sput '%s' in %s memory, expected %s"
                                     % (op, dtype, side, name, where, want))
    assert not wrong, "\n".join(wrong)
    if hvd.nccl_built():
        assert lines[("HorovodAllreduce", "int32")] == (
            "kernel", {"in": ["tensor:D"], "out": ["sum:D"]})
