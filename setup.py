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
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


# The distributions that provide the ``tensorflow`` module, in the order a
# requirement should name them when more than one is installed.
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly",
                    "tf-nightly-cpu", "intel-tensorflow", "tensorflow-aarch64", "tensorflow-macos")
# What tfhvd/ imports besides TensorFlow.  Keras is not listed: every supported
# TensorFlow (2.16+) depends on Keras 3 itself (2.22 on keras-nightly), and a
# requirement of ours would replace the one TensorFlow chose.
BASE_REQUIREMENTS = ["numpy>=1.23", "cloudpickle>=2.0", "packaging>=20.0"]
# Without an installed TensorFlow (an sdist made where there is none).
TF_FALLBACK = "tensorflow>=2.16"
ISOLATED_BUILD = """tfhvd: pip is building tfhvd in an isolated build environment, which holds no
TensorFlow. tfhvd's library must be compiled against the TensorFlow it will run with, the one
in the Python that runs pip. Install it with --no-build-isolation, e.g.

    %s -m pip install --no-build-isolation <tfhvd checkout or sdist>

(with TensorFlow, setuptools and wheel installed there first; see docs/install.md)."""


def in_isolated_build() -> bool:
    """Whether pip runs this file inside its isolated build environment
    (``pip-build-env-*`` on the path), where the user's packages are hidden."""
    paths = list(sys.path) + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return any("pip-build-env-" in p for p in paths)


def installed_tensorflow() -> Optional[Tuple[str, str]]:
    """(distribution name, version) of the TensorFlow in this Python, read
    from its metadata without importing it; None when there is none."""
    from importlib import metadata

    names: List[str] = list(TF_DISTRIBUTIONS)
    if hasattr(metadata, "packages_distributions"):  # Python 3.10+
        names += [n for n in metadata.packages_distributions().get("tensorflow", [])
                  if n not in names]
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def release_range(version: str) -> Tuple[str, str]:
    """The lower and upper bounds of ``version``'s release line: ``2.16.2`` ->
    ("2.16", "2.17"); a pre-release keeps its own version as the lower bound
    (``2.22.0rc0`` -> ("2.22.0rc0", "2.23")) so that pip accepts it."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ValueError("cannot read a release from TensorFlow's version %r" % version)
    major, minor = int(m.group(1)), int(m.group(2))
    pre = re.search(r"(a|b|rc|dev)\d*", version[m.end():])
    lower = version if pre else "%d.%d" % (major, minor)
    return lower, "%d.%d" % (major, minor + 1)


def requirements(tf: Optional[Tuple[str, str]]) -> Tuple[List[str], Dict[str, List[str]]]:
    """install_requires and extras_require for the TensorFlow the library is
    built against: that TensorFlow's release line, and tf-keras of the same
    line, so that no extra can move TensorFlow (or, through it, numpy and
    protobuf) away from what the library was compiled for."""
    if tf is None:
        tf_req, tf_keras = TF_FALLBACK, "tf-keras>=2.16"
    else:
        name, version = tf
        lower, upper = release_range(version)
        tf_req = "%s>=%s,<%s" % (name, lower, upper)
        keras2 = "tf-keras-nightly" if name.startswith("tf-nightly") else "tf-keras"
        tf_keras = "%s>=%s,<%s" % (keras2, lower, upper)
    extras = {
        # Keras 2 under TF_USE_LEGACY_KERAS=1 (tfhvd.tensorflow.keras on tf-keras).
        "tf-keras": [tf_keras],
        "mpi": ["mpi4py>=3.1"],
        # What the scripts in examples/ import beyond the library.
        "examples": ["scikit-learn>=1.3"],
        # The test suite (tests/).
        "test": ["pytest>=8.0", "mpi4py>=3.1", "scikit-learn>=1.3", "matplotlib>=3.5", tf_keras],
        # Timeline pictures (tfhvd-timeline render); the summary needs nothing.
        "timeline": ["matplotlib>=3.5"],
        # The cluster-engine launchers tfhvd.ray and tfhvd.spark.
        "ray": ["ray>=2.10"],
        # pyarrow and fsspec: the Keras Estimator's Parquet reader and Stores.
        "spark": ["pyspark>=3.5", "pyarrow>=14", "fsspec>=2023.1"],
    }
    return [tf_req] + BASE_REQUIREMENTS, extras


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
    """CPU backends and the XLA ops: TFHVD_WITHOUT_MPI/TFHVD_WITHOUT_GLOO/
    TFHVD_WITHOUT_XLA_OPS=1 leave one out, TFHVD_WITH_<NAME>=1 requires it
    (the HOROVOD_* names work too); otherwise CMake builds whatever the
    machine has."""
    args = []
    for name in ("MPI", "GLOO", "XLA_OPS"):
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


def main() -> None:
    """Name, version and scripts: pyproject.toml; the dependencies follow the
    installed TensorFlow (requirements())."""
    tf = installed_tensorflow()
    if tf is None and in_isolated_build():
        sys.exit(ISOLATED_BUILD % sys.executable)
    install_requires, extras_require = requirements(tf)
    setup(
        ext_modules=[CMakeExtension("tfhvd.tfhvd_ops")],
        cmdclass={"build_ext": CMakeBuild},
        install_requires=install_requires,
        extras_require=extras_require,
    )


if __name__ == "__main__":
    main()
