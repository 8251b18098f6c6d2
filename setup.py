"""Builds tfhvd: the Python package plus one TensorFlow custom-op library.

The package's metadata and dependencies are in pyproject.toml; this file is
the build driver.  The library is compiled by CMake from ``tfhvd_ops/``
against the TensorFlow installed in the running Python (``tf.sysconfig``
flags), with MPI found through ``mpicc``.  Install with
``pip install --no-build-isolation .`` so that the library links the same
TensorFlow it will run with (``make setup`` does this for you); the library
records that TensorFlow's version, and tfhvd refuses to load it under another
TensorFlow release (tfhvd/common/library.py).
"""

import importlib.util
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def gpu_cmake_args(tf) -> list:
    """CMake arguments of the GPU build (TFHVD_GPU_OPERATIONS=NCCL and friends,
    read by tfhvd_ops/gpu_config.py), or of a CPU-only build."""
    spec = importlib.util.spec_from_file_location(
        "tfhvd_gpu_config", os.path.join(ROOT, "tfhvd_ops", "gpu_config.py"))
    gpu_config = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gpu_config  # dataclasses look their module up
    spec.loader.exec_module(gpu_config)
    info = tf.sysconfig.get_build_info()
    try:
        cfg = gpu_config.configure(os.environ, info.get("cuda_version"),
                                   tf.sysconfig.get_include())
    except gpu_config.GpuConfigError as e:
        sys.exit(str(e))
    if cfg is None:
        return ["-DTFHVD_WITH_NCCL=OFF"]
    print(cfg.summary(), flush=True)
    return cfg.cmake_args()


def _flag(env, *names: str) -> bool:
    return any(env.get(n, "").strip().lower() in ("1", "true", "yes", "on") for n in names)


def backend_cmake_args(env) -> list:
    """CPU backends: TFHVD_WITHOUT_MPI/TFHVD_WITHOUT_GLOO=1 leave one out,
    TFHVD_WITH_MPI/TFHVD_WITH_GLOO=1 require one (Horovod's HOROVOD_* names
    work too); otherwise CMake builds whichever is installed."""
    args = []
    for name in ("MPI", "GLOO"):
        without = _flag(env, "TFHVD_WITHOUT_" + name, "HOROVOD_WITHOUT_" + name)
        with_ = _flag(env, "TFHVD_WITH_" + name, "HOROVOD_WITH_" + name)
        if without and with_:
            sys.exit("tfhvd: both TFHVD_WITH_%s and TFHVD_WITHOUT_%s are set" % (name, name))
        args.append("-DTFHVD_WITH_%s=%s" % (name, "OFF" if without else "ON" if with_ else "AUTO"))
    return args


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures (once) and builds tfhvd_ops/ with CMake; rebuilds only what changed."""

    def get_ext_filename(self, ext_name: str) -> str:
        return os.path.join(*ext_name.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        try:
            import tensorflow as tf
        except ImportError:
            sys.exit(
                "tfhvd: TensorFlow is not installed in this Python (%s).\n"
                "Install it first: %s -m pip install tensorflow==2.21.0\n"
                "(`make setup` does the whole set-up for you)." % (sys.executable, sys.executable)
            )
        build_dir = os.environ.get("TFHVD_BUILD_DIR", os.path.join(ROOT, "build"))
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        os.makedirs(build_dir, exist_ok=True)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        cflags = " ".join(tf.sysconfig.get_compile_flags())
        lflags = " ".join(tf.sysconfig.get_link_flags())
        args = [
            "-DTF_COMPILE_FLAGS=" + cflags,
            "-DTF_LINK_FLAGS=" + lflags,
            "-DTFHVD_OUTPUT_DIR=" + build_dir,
            "-DCMAKE_BUILD_TYPE=" + os.environ.get("TFHVD_BUILD_TYPE", "Release"),
            "-DTFHVD_TF_VERSION=" + tf.__version__,
            # The test programs of tests/core (a source checkout); an sdist has no tests/.
            "-DTFHVD_BUILD_CORE_TEST=" + ("ON" if os.path.isdir(os.path.join(ROOT, "tests", "core"))
                                          else "OFF"),
        ] + gpu_cmake_args(tf) + backend_cmake_args(os.environ)
        stamp = os.path.join(build_dir, "tfhvd-configure-args")
        old = open(stamp).read() if os.path.exists(stamp) else None
        if old != "\n".join(args) or not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.check_call(
                ["cmake", "-S", os.path.join(ROOT, "tfhvd_ops"), "-B", build_dir] + args
            )
            with open(stamp, "w") as f:
                f.write("\n".join(args))
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
        built = os.path.join(build_dir, "tfhvd_ops.so")
        if not os.path.exists(target) or os.path.getmtime(built) > os.path.getmtime(target):
            shutil.copy2(built, target)


# Name, version, dependencies, extras and scripts: pyproject.toml.
setup(
    ext_modules=[CMakeExtension("tfhvd.tfhvd_ops")],
    cmdclass={"build_ext": CMakeBuild},
)
