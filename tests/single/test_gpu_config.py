"""The GPU build's configuration (tfhvd_ops/gpu_config.py): which ops get GPU
kernels, where CUDA and NCCL are found, and the messages when they are not."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("gpu_config_under_test",
                                               os.path.join(ROOT, "tfhvd_ops", "gpu_config.py"))
gc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gc
_spec.loader.exec_module(gc)



def no_wheel(name):
    return None


def test_no_gpu_variables_means_cpu_build():
    assert gc.requested_gpu_ops({}) == []
    assert gc.configure({}) is None


def test_gpu_operations_turns_on_every_op_and_per_op_switches_win():
    assert gc.requested_gpu_ops({"TFHVD_GPU_OPERATIONS": "NCCL"}) == list(gc.OPS)
    assert gc.requested_gpu_ops({"HOROVOD_GPU_OPERATIONS": "nccl",
                                 "TFHVD_GPU_BROADCAST": "NONE"}) == [
        "ALLREDUCE", "ALLGATHER", "ALLTOALL", "REDUCESCATTER"]
    assert gc.requested_gpu_ops({"HOROVOD_GPU_ALLREDUCE": "NCCL"}) == ["ALLREDUCE"]


def test_other_gpu_backends_are_refused_with_the_variable_named():
    with pytest.raises(gc.GpuConfigError, match="HOROVOD_GPU_ALLREDUCE=MPI.*NCCL only"):
        gc.requested_gpu_ops({"HOROVOD_GPU_ALLREDUCE": "MPI"})


def make_nccl(root, version=(2, 27, 7)):
    os.makedirs(os.path.join(root, "include"))
    os.makedirs(os.path.join(root, "lib"))
    with open(os.path.join(root, "include", "nccl.h"), "w") as f:
        f.write("#define NCCL_MAJOR %d\n#define NCCL_MINOR %d\n#define NCCL_PATCH %d\n" % version)
    open(os.path.join(root, "lib", "libnccl.so.2"), "w").close()


def test_nccl_missing_says_where_it_looked_and_what_to_set(tmp_path):
    with pytest.raises(gc.GpuConfigError) as e:
        gc.find_nccl({}, find_spec=no_wheel, system_roots=(str(tmp_path),))
    msg = str(e.value)
    assert str(tmp_path) in msg and "TFHVD_NCCL_HOME" in msg and "nvidia-nccl-cu12" in msg


def test_nccl_home_is_used_and_checked(tmp_path):
    make_nccl(str(tmp_path / "nccl"))
    found = gc.find_nccl({"HOROVOD_NCCL_HOME": str(tmp_path / "nccl")}, find_spec=no_wheel,
                         system_roots=())
    assert found["version"] == "2.27.7" and found["lib"].endswith("libnccl.so.2")
    with pytest.raises(gc.GpuConfigError, match="TFHVD_NCCL_HOME=.*has no include/nccl.h"):
        gc.find_nccl({"TFHVD_NCCL_HOME": str(tmp_path)}, find_spec=no_wheel, system_roots=())


def test_old_nccl_is_refused(tmp_path):
    """The oldest NCCL supported is 2.16 (the first for CUDA 12); 2.15 is
    refused by name, 2.16.2 (the oldest nvidia-nccl-cu12 wheel) is taken."""
    make_nccl(str(tmp_path / "nccl"), (2, 15, 5))
    with pytest.raises(gc.GpuConfigError, match="NCCL 2.15.5 .*too old.*needs NCCL 2.16 or newer"):
        gc.find_nccl({"TFHVD_NCCL_HOME": str(tmp_path / "nccl")}, find_spec=no_wheel,
                     system_roots=())
    make_nccl(str(tmp_path / "oldest"), (2, 16, 2))
    found = gc.find_nccl({"TFHVD_NCCL_HOME": str(tmp_path / "oldest")}, find_spec=no_wheel,
                         system_roots=())
    assert found["version"] == "2.16.2"


def make_cuda(root, major):
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "include"))
    os.makedirs(os.path.join(root, "lib64"))
    nvcc = os.path.join(root, "bin", "nvcc")
    with open(nvcc, "w") as f:
        f.write("#!/bin/sh\necho 'Cuda compilation tools, release %d.5, V%d.5.82'\n"
                % (major, major))
    os.chmod(nvcc, 0o755)
    open(os.path.join(root, "include", "cuda_runtime_api.h"), "w").close()
    open(os.path.join(root, "lib64", "libcudart.so"), "w").close()


def find_cuda(env, tf_major, **kw):
    kw.setdefault("find_spec", no_wheel)
    kw.setdefault("which", lambda name: None)
    kw.setdefault("standard", ())
    return gc.find_cuda(env, tf_major, None, **kw)


def test_cuda_missing_says_where_it_looked_and_what_to_set():
    with pytest.raises(gc.GpuConfigError) as e:
        find_cuda({}, 12, standard=("/nonexistent-cuda",))
    msg = str(e.value)
    assert "no CUDA 12 compiler" in msg and "TFHVD_CUDA_HOME" in msg and "ptxas but no nvcc" in msg
    assert "nvidia-cuda-nvrtc-cu12" in msg


def test_cuda_home_of_the_right_version_is_used(tmp_path):
    make_cuda(str(tmp_path / "cuda"), 12)
    found = find_cuda({"TFHVD_CUDA_HOME": str(tmp_path / "cuda")}, 12)
    assert found["major"] == 12 and not found["check_only"]
    assert found["compiler"] == "nvcc" and found["tool"].endswith("bin/nvcc")
    assert found["cudart"].endswith("lib64/libcudart.so")


def make_wheels(tmp_path, nvrtc_major):
    """nvidia.cuda_nvrtc (libnvrtc.so.<major>) and nvidia.cuda_runtime
    (headers, libcudart) wheel folders; returns a find_spec for them."""
    nvrtc = tmp_path / "nvrtc"
    (nvrtc / "lib").mkdir(parents=True)
    (nvrtc / "lib" / ("libnvrtc.so.%d" % nvrtc_major)).touch()
    (nvrtc / "lib" / "libnvrtc-builtins.so.12.5").touch()
    runtime = tmp_path / "runtime"
    (runtime / "include").mkdir(parents=True)
    (runtime / "lib").mkdir()
    for h in ("cuda_fp16.h", "cuda_runtime_api.h"):
        (runtime / "include" / h).touch()
    (runtime / "lib" / "libcudart.so.12").touch()
    dirs = {"nvidia.cuda_nvrtc": str(nvrtc), "nvidia.cuda_runtime": str(runtime)}

    class Spec:
        def __init__(self, d):
            self.submodule_search_locations = [d]

    return lambda n: Spec(dirs[n]) if n in dirs else None


def test_nvrtc_wheel_of_tensorflows_cuda_compiles_the_device_code(tmp_path):
    find_spec = make_wheels(tmp_path, 12)
    tf_include = tmp_path / "tfinc" / "third_party" / "gpus" / "cuda" / "include"
    tf_include.mkdir(parents=True)
    (tf_include / "cuda_runtime_api.h").touch()
    make_cuda(str(tmp_path / "cuda13"), 13)  # a CUDA 13 nvcc on PATH is not taken
    found = gc.find_cuda({}, 12, str(tmp_path / "tfinc"), find_spec=find_spec,
                         which=lambda n: str(tmp_path / "cuda13" / "bin" / "nvcc"), standard=())
    assert found["compiler"] == "nvrtc" and found["tool"].endswith("libnvrtc.so.12")
    assert found["major"] == 12 and not found["check_only"]
    assert found["device_include"] == [str(tmp_path / "runtime" / "include")]
    assert found["cudart"].endswith("libcudart.so.12")
    # TFHVD_DEVICE_COMPILER=nvcc refuses NVRTC; the CUDA 13 nvcc still needs the
    # explicitly named fallback.
    with pytest.raises(gc.GpuConfigError, match="another CUDA major version"):
        gc.find_cuda({"TFHVD_DEVICE_COMPILER": "nvcc"}, 12, str(tmp_path / "tfinc"),
                     find_spec=find_spec, which=lambda n: str(tmp_path / "cuda13/bin/nvcc"),
                     standard=())


def test_nvrtc_of_another_cuda_major_is_not_used(tmp_path):
    with pytest.raises(gc.GpuConfigError, match="no CUDA 12 compiler"):
        find_cuda({}, 12, find_spec=make_wheels(tmp_path, 13))


def test_cuda_of_another_major_is_refused_unless_compile_check(tmp_path):
    make_cuda(str(tmp_path / "cuda"), 13)
    env = {"CUDA_HOME": str(tmp_path / "cuda")}
    with pytest.raises(gc.GpuConfigError, match="another CUDA major version"):
        find_cuda(env, 12)
    tf_include = tmp_path / "tfinc"
    (tf_include / "third_party" / "gpus" / "cuda" / "include").mkdir(parents=True)
    (tf_include / "third_party" / "gpus" / "cuda" / "include" / "cuda_runtime_api.h").touch()
    runtime = tmp_path / "wheel" / "lib"
    runtime.mkdir(parents=True)
    (runtime / "libcudart.so.12").touch()

    class Spec:
        submodule_search_locations = [str(tmp_path / "wheel")]

    found = gc.find_cuda(dict(env, TFHVD_CUDA_COMPILE_CHECK="1"), 12, str(tf_include),
                         find_spec=lambda n: Spec() if n == "nvidia.cuda_runtime" else None,
                         which=lambda n: None, standard=())
    assert found["check_only"] and found["cudart"].endswith("libcudart.so.12")
    assert found["compiler"] == "nvcc"
    assert any("compile-and-link check" in n for n in found["notes"])


def test_setup_py_stops_with_the_message():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFHVD_", "HOROVOD_"))}
    env.update(TFHVD_GPU_OPERATIONS="NCCL", TFHVD_NCCL_HOME="/nonexistent/nccl",
               TFHVD_BUILD_DIR="/tmp/tfhvd-never-built")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "TFHVD_NCCL_HOME=/nonexistent/nccl has no include/nccl.h" in r.stderr


def test_default_archs_cover_volta_to_blackwell():
    assert gc.DEFAULT_ARCHS.split(";") == ["70", "75", "80", "86", "89", "90", "100", "120"]


def test_versions_that_differ_from_tensorflows_cuda_are_warned_at_build_time(tmp_path):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 12040\n")
    assert gc.cudart_header_version([str(tmp_path), str(inc)]) == "12.4"
    assert gc.cudart_header_version([str(tmp_path)]) is None
    assert gc.version_warnings("12.5.1", "12.5", "12.5") == []
    assert gc.version_warnings(None, "11.8", "13.0") == []
    same_major, other_major = gc.version_warnings("12.5.1", "12.4", "13.0")
    assert "runtime headers are CUDA 12.4" in same_major and "same major" in same_major
    assert "NVRTC is CUDA 13.0" in other_major and "different major" in other_major
