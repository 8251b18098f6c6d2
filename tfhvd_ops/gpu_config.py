"""Configuration of tfhvd's GPU build: which ops get GPU kernels, and where
CUDA and NCCL are.  The one place that reads the build variables; setup.py
turns the result into CMake arguments, and tests/gpu/device_check.sh runs
this file to configure the TensorFlow-free harness.

Build variables (each also accepted under its HOROVOD_* name):

  TFHVD_GPU_OPERATIONS=NCCL   GPU kernels for every collective op
  TFHVD_GPU_ALLREDUCE=NCCL    ... or op by op (also ALLGATHER, BROADCAST,
                              ALLTOALL, REDUCESCATTER); a per-op value wins
  TFHVD_NCCL_HOME             NCCL install with include/ and lib/
  TFHVD_NCCL_INCLUDE, TFHVD_NCCL_LIB  override the two folders
  TFHVD_CUDA_HOME             a real CUDA toolkit (bin/nvcc, include/, lib64/) of
                              TensorFlow's CUDA major version: its nvcc compiles
                              the device code
  TFHVD_DEVICE_COMPILER       nvrtc or nvcc: force one route (default: see below)
  TFHVD_CUDA_ARCHS            GPU architectures of the device code (default
                              "70;75;80;86;89;90;100;120": Volta to Blackwell, those the
                              compiler knows, plus PTX of the oldest)
  TFHVD_CUDA_COMPILE_CHECK=1  the explicitly named fallback: accept an nvcc whose
                              major version differs from TensorFlow's CUDA (e.g.
                              CUDA 13 for TensorFlow's CUDA 12).  A compile-and-link
                              check only: its device code needs that CUDA's driver.

Where NCCL is looked for, in order: the variables above, the nvidia-nccl-cu12
wheel (``import nvidia.nccl``, installed by ``tensorflow[and-cuda]``), then
/usr and /usr/local/nccl.

The device code (cuda/gpu_kernels.cu) is compiled apart into a cubin per
architecture plus PTX, embedded as data and loaded with the driver API
(cuda/build_device_code.py, cuda/device_kernels.h).  Its compiler, in order:
TFHVD_CUDA_HOME's nvcc (or HOROVOD_CUDA_HOME, CUDA_HOME, CUDA_PATH) when its
major version is TensorFlow's; NVRTC from the nvidia-cuda-nvrtc-cu12 wheel of
TensorFlow's CUDA (``tensorflow[and-cuda]`` installs it; with the headers of
nvidia-cuda-runtime-cu12), the default on a machine without a CUDA 12
toolkit; an nvcc of TensorFlow's major in /usr/local/cuda-<major>*,
/usr/local/cuda or on PATH; and only with TFHVD_CUDA_COMPILE_CHECK=1 an nvcc
of another major.  (No CUDA 12 nvcc is on PyPI or Debian; the
nvidia-cuda-nvcc-cu12 wheels hold only ptxas and libnvvm.)  The C++ files
use the toolkit's headers when its version matches, else TensorFlow's
bundled CUDA headers; libcudart comes from the nvidia-cuda-runtime-cu12
wheel.

Run as a script: ``python gpu_config.py --cmake`` prints the CMake arguments
for a TensorFlow-free build, one per line.
"""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

OPS = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
PREFIXES = ("TFHVD_", "HOROVOD_")
DEFAULT_ARCHS = "70;75;80;86;89;90;100;120"
# The oldest NCCL the backend builds with: 2.16, the first release for CUDA 12
# (backends/nccl/cuda_check.h says the same to the compiler).
OLDEST_NCCL = (2, 16)


class GpuConfigError(Exception):
    """A GPU build was asked for and cannot be configured; the message says
    where tfhvd looked and which variable to set."""


def _get(env: Mapping[str, str], name: str) -> Optional[str]:
    for prefix in PREFIXES:
        value = env.get(prefix + name, "").strip()
        if value:
            return value
    return None


def _var(env: Mapping[str, str], name: str) -> str:
    """The variable name that set ``name`` (for messages)."""
    for prefix in PREFIXES:
        if env.get(prefix + name, "").strip():
            return prefix + name
    return "TFHVD_" + name


def requested_gpu_ops(env: Mapping[str, str]) -> List[str]:
    """The ops that get GPU kernels, from TFHVD_GPU_OPERATIONS and the per-op
    switches.  Raises GpuConfigError on a value other than NCCL."""
    def parse(name: str) -> Optional[bool]:
        value = _get(env, name)
        if value is None:
            return None
        v = value.upper()
        if v == "NCCL":
            return True
        if v in ("NONE", "CPU", "0", "OFF"):
            return False
        raise GpuConfigError(
            "tfhvd: %s=%s is not supported: tfhvd runs GPU collectives with NCCL only "
            "(CUDA-aware MPI, Gloo, DDL and CCL are not built). Set it to NCCL, or unset it "
            "for a CPU-only build." % (_var(env, name), value))

    default = parse("GPU_OPERATIONS")
    ops = []
    for op in OPS:
        own = parse("GPU_" + op)
        if own if own is not None else bool(default):
            ops.append(op)
    return ops


def _version_major(nvcc: str) -> Optional[int]:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return int(m.group(1)) if m else None


def _wheel_dirs(module: str, find_spec: Callable = importlib.util.find_spec) -> List[str]:
    """Folders of an installed ``nvidia.*`` wheel, or []."""
    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return [p for p in (spec.submodule_search_locations or []) if os.path.isdir(p)]


def _first(paths: List[str]) -> Optional[str]:
    for p in paths:
        if p and os.path.exists(p):
            return p
    return None


@dataclass
class GpuConfig:
    ops: List[str]
    device_compiler: str      # "nvrtc" or "nvcc"
    device_tool: str          # libnvrtc.so.N or bin/nvcc
    cuda_major: Optional[int]
    device_include: List[str]
    cuda_include: List[str]
    cudart: str
    nccl_include: str
    nccl_lib: str
    nccl_version: str
    archs: str
    compile_check_only: bool = False
    notes: List[str] = field(default_factory=list)
    python: str = sys.executable

    def cmake_args(self) -> List[str]:
        return [
            "-DTFHVD_WITH_NCCL=ON",
            "-DTFHVD_GPU_OPS=" + ";".join(self.ops),
            "-DTFHVD_DEVICE_COMPILER=" + self.device_compiler,
            "-DTFHVD_DEVICE_TOOL=" + self.device_tool,
            "-DTFHVD_DEVICE_INCLUDE=" + ";".join(self.device_include),
            "-DTFHVD_PYTHON=" + self.python,
            "-DTFHVD_CUDA_INCLUDE=" + ";".join(self.cuda_include),
            "-DTFHVD_CUDART_LIB=" + self.cudart,
            "-DTFHVD_NCCL_INCLUDE=" + self.nccl_include,
            "-DTFHVD_NCCL_LIB=" + self.nccl_lib,
            "-DTFHVD_CUDA_ARCHS=" + self.archs,
        ]

    def summary(self) -> str:
        lines = ["tfhvd GPU build: GPU kernels for %s" % ", ".join(o.lower() for o in self.ops),
                 "  device code: %s %s (CUDA %s)%s" % (
                     self.device_compiler, self.device_tool, self.cuda_major,
                     "  [compile check only]" if self.compile_check_only else ""),
                 "  CUDA headers: %s" % " ".join(self.cuda_include),
                 "  libcudart:    %s" % self.cudart,
                 "  NCCL %s: %s, %s" % (self.nccl_version, self.nccl_include, self.nccl_lib),
                 "  archs: %s" % self.archs]
        return "\n".join(lines + ["  note: " + n for n in self.notes])


def find_nccl(env: Mapping[str, str], find_spec: Callable = importlib.util.find_spec,
              system_roots=("/usr", "/usr/local/nccl", "/usr/local")) -> Dict[str, str]:
    """``{"include": dir, "lib": file, "version": "2.x.y"}``; raises with the
    places it looked."""
    looked = []
    roots = []
    home = _get(env, "NCCL_HOME")
    if home:
        if not os.path.exists(os.path.join(home, "include", "nccl.h")):
            raise GpuConfigError("tfhvd: %s=%s has no include/nccl.h; point it at an NCCL "
                                 "install (with include/ and lib/)"
                                 % (_var(env, "NCCL_HOME"), home))
        roots.append((home, _var(env, "NCCL_HOME")))
    for d in _wheel_dirs("nvidia.nccl", find_spec):
        roots.append((d, "the nvidia-nccl-cu12 wheel"))
    for r in system_roots:
        roots.append((r, "the system"))
    inc = _get(env, "NCCL_INCLUDE")
    lib = _get(env, "NCCL_LIB")
    if inc and not os.path.exists(os.path.join(inc, "nccl.h")):
        raise GpuConfigError("tfhvd: %s=%s has no nccl.h" % (_var(env, "NCCL_INCLUDE"), inc))
    if lib and os.path.isdir(lib):
        found = _first([os.path.join(lib, n) for n in ("libnccl.so", "libnccl.so.2")])
        if not found:
            raise GpuConfigError("tfhvd: %s=%s has no libnccl.so" % (_var(env, "NCCL_LIB"), lib))
        lib = found
    for root, what in roots:
        cand_inc = _first([os.path.join(root, "include", "nccl.h")])
        libdirs = [os.path.join(root, d) for d in ("lib", "lib64", "lib/x86_64-linux-gnu",
                                                     "lib/aarch64-linux-gnu")]
        cand_lib = _first([os.path.join(d, n) for d in libdirs
                           for n in ("libnccl.so", "libnccl.so.2")])
        looked.append("%s (%s)" % (root, what))
        if inc is None and cand_inc and (lib is not None or cand_lib):
            inc = os.path.dirname(cand_inc)
        if lib is None and cand_lib and (inc is not None):
            lib = cand_lib
        if inc and lib:
            break
    if not (inc and lib):
        raise GpuConfigError(
            "tfhvd: a GPU build was asked for (TFHVD_GPU_OPERATIONS=NCCL) but NCCL was not "
            "found.\nLooked for include/nccl.h and lib/libnccl.so in: %s.\n"
            "Install it with `pip install nvidia-nccl-cu12` (tensorflow[and-cuda] does), or set "
            "TFHVD_NCCL_HOME (or TFHVD_NCCL_INCLUDE and TFHVD_NCCL_LIB) to an NCCL install."
            % "; ".join(looked))
    with open(os.path.join(inc, "nccl.h"), errors="replace") as f:
        text = f.read()
    parts = [re.search(r"#define NCCL_%s\s+(\d+)" % k, text) for k in ("MAJOR", "MINOR", "PATCH")]
    version = ".".join(p.group(1) for p in parts) if all(parts) else "unknown"
    if all(parts) and (int(parts[0].group(1)), int(parts[1].group(1))) < OLDEST_NCCL:
        raise GpuConfigError("tfhvd: NCCL %s at %s is too old; tfhvd needs NCCL %d.%d or newer "
                             "(the first NCCL for CUDA 12): `pip install -U nvidia-nccl-cu12`, "
                             "or set TFHVD_NCCL_HOME to a newer NCCL"
                             % ((version, inc) + OLDEST_NCCL))
    return {"include": inc, "lib": lib, "version": version}


def _find_nvrtc(tf_cuda_major: Optional[int], find_spec: Callable) -> Optional[Dict[str, object]]:
    """NVRTC from the nvidia-cuda-nvrtc-cu<major> wheel, with the CUDA
    headers of the nvidia-cuda-runtime wheel, or None."""
    for d in _wheel_dirs("nvidia.cuda_nvrtc", find_spec):
        for lib in sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so.*"))):
            m = re.fullmatch(r"libnvrtc\.so\.(\d+)", os.path.basename(lib))
            if not m or (tf_cuda_major is not None and int(m.group(1)) != tf_cuda_major):
                continue
            headers = [os.path.join(r, "include") for r in _wheel_dirs("nvidia.cuda_runtime",
                                                                         find_spec)
                       if os.path.exists(os.path.join(r, "include", "cuda_fp16.h"))]
            if headers:
                return {"tool": lib, "major": int(m.group(1)), "include": headers[:1]}
    return None


def find_cuda(env: Mapping[str, str], tf_cuda_major: Optional[int],
              tf_include: Optional[str], find_spec: Callable = importlib.util.find_spec,
              which: Callable = shutil.which, version_of: Callable = _version_major,
              standard=("/usr/local/cuda-{major}*", "/usr/local/cuda", "/opt/cuda"),
              ) -> Dict[str, object]:
    """``{"compiler", "tool", "major", "device_include", "include", "cudart",
    "check_only", "notes"}``: what compiles the device code, and the CUDA
    headers and runtime of the C++ files."""
    check_only = (_get(env, "CUDA_COMPILE_CHECK") or "0").lower() in ("1", "true", "yes", "on")
    forced = (_get(env, "DEVICE_COMPILER") or "").lower()
    if forced not in ("", "nvrtc", "nvcc"):
        raise GpuConfigError("tfhvd: %s=%s: expected nvrtc or nvcc"
                             % (_var(env, "DEVICE_COMPILER"), forced))
    explicit, found = [], []  # (root, what)
    for name in ("TFHVD_CUDA_HOME", "HOROVOD_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            explicit.append((env[name], name))
    for pattern in standard:
        for root in sorted(glob.glob(pattern.format(major=tf_cuda_major or "")), reverse=True):
            found.append((root, "a standard location"))
    on_path = which("nvcc")
    if on_path:
        found.append((os.path.dirname(os.path.dirname(os.path.realpath(on_path))), "PATH"))
    for module in ("nvidia.cuda_nvcc", "nvidia.cu12", "nvidia.cu13"):
        for d in _wheel_dirs(module, find_spec):
            found.append((d, "the %s wheel" % module))
    looked, mismatched = [], []

    def nvcc_of(homes) -> Optional[tuple]:
        for root, what in homes:
            nvcc = os.path.join(root, "bin", "nvcc")
            looked.append("%s (%s)" % (nvcc, what))
            if not os.path.exists(nvcc):
                if what in ("TFHVD_CUDA_HOME", "HOROVOD_CUDA_HOME"):
                    raise GpuConfigError("tfhvd: %s=%s has no bin/nvcc; point it at a CUDA %s"
                                         "toolkit" % (what, root, "%s " % tf_cuda_major
                                                      if tf_cuda_major else ""))
                continue
            major = version_of(nvcc)
            if tf_cuda_major is not None and major != tf_cuda_major:
                mismatched.append((root, nvcc, major))
                continue
            return root, nvcc, major
        return None

    notes = []
    chosen = None  # (compiler, tool, major, toolkit root or None, mismatch)
    toolkit = nvcc_of(explicit) if forced != "nvrtc" else None
    if toolkit:
        chosen = ("nvcc", toolkit[1], toolkit[2], toolkit[0], False)
    nvrtc = _find_nvrtc(tf_cuda_major, find_spec) if forced != "nvcc" and not chosen else None
    looked.append("libnvrtc.so.%s (the nvidia-cuda-nvrtc-cu%s wheel)"
                  % (tf_cuda_major or "N", tf_cuda_major or "N"))
    if nvrtc:
        chosen = ("nvrtc", nvrtc["tool"], nvrtc["major"], None, False)
    if chosen is None and forced != "nvrtc":
        toolkit = nvcc_of(found)
        if toolkit:
            chosen = ("nvcc", toolkit[1], toolkit[2], toolkit[0], False)
    if chosen is None and mismatched and check_only and forced != "nvrtc":
        root, nvcc, major = mismatched[0]
        chosen = ("nvcc", nvcc, major, root, True)
        notes.append("nvcc is CUDA %s but TensorFlow was built with CUDA %s: the device code is "
                     "compiled for a compile-and-link check (TFHVD_CUDA_COMPILE_CHECK=1); it "
                     "needs a driver for CUDA %s and is not a library to ship"
                     % (major, tf_cuda_major, major))
    if chosen is None:
        why = ""
        if mismatched:
            why = ("\nFound nvcc of another CUDA major version than TensorFlow's CUDA %s: %s "
                   "(TFHVD_CUDA_COMPILE_CHECK=1 accepts it for a compile check only)." %
                   (tf_cuda_major, ", ".join("%s (CUDA %s)" % (n, m) for _, n, m in mismatched)))
        raise GpuConfigError(
            "tfhvd: a GPU build was asked for (TFHVD_GPU_OPERATIONS=NCCL) but no CUDA %scompiler "
            "for the device code was found.\nLooked for: %s.%s\nInstall NVRTC and the CUDA "
            "headers from PyPI: `pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12` "
            "(tensorflow[and-cuda] does; `make gpu-deps` too), or set TFHVD_CUDA_HOME to a CUDA "
            "%stoolkit (the nvidia/cuda:*-devel images have one in /usr/local/cuda). The "
            "nvidia-cuda-nvcc-cu12 wheel alone does not help: it ships ptxas but no nvcc."
            % ("%s " % tf_cuda_major if tf_cuda_major else "", "; ".join(looked), why,
               "%s " % tf_cuda_major if tf_cuda_major else ""))
    compiler, tool, major, root, mismatch = chosen
    # Headers and libcudart for the C++ files must match the CUDA runtime
    # TensorFlow loads: the toolkit's own when its version matches, else
    # TensorFlow's bundled headers and the nvidia-cuda-runtime wheel.
    include, cudart = [], None
    if root and not mismatch and os.path.exists(os.path.join(root, "include",
                                                             "cuda_runtime_api.h")):
        include = [os.path.join(root, "include")]
        if os.path.isdir(os.path.join(root, "include", "cccl")):
            include.append(os.path.join(root, "include", "cccl"))
        cudart = _first([os.path.join(root, d, "libcudart.so")
                         for d in ("lib64", "lib", "targets/x86_64-linux/lib",
                                   "targets/sbsa-linux/lib")])
    if not include and tf_include:
        tf_cuda = os.path.join(tf_include, "third_party", "gpus", "cuda")
        if os.path.exists(os.path.join(tf_cuda, "include", "cuda_runtime_api.h")):
            include = [os.path.join(tf_cuda, "include"), os.path.join(tf_cuda, "libcudacxx",
                                                                      "include")]
            notes.append("CUDA headers from TensorFlow's include folder")
    if cudart is None:
        for d in _wheel_dirs("nvidia.cuda_runtime", find_spec):
            cudart = _first(sorted(glob.glob(os.path.join(d, "lib", "libcudart.so*"))))
            if cudart:
                break
    if not include or cudart is None:
        raise GpuConfigError(
            "tfhvd: found the device compiler %s but not the CUDA %s runtime (%s).\nLooked in "
            "%s, TensorFlow's include folder and the nvidia-cuda-runtime-cu12 wheel.\n"
            "Install it with `pip install nvidia-cuda-runtime-cu12` (tensorflow[and-cuda] does), "
            "or set TFHVD_CUDA_HOME to a complete CUDA toolkit."
            % (tool, tf_cuda_major or "", "headers" if not include else "libcudart",
               root or "the toolkit"))
    device_include = nvrtc["include"] if compiler == "nvrtc" else []
    return {"compiler": compiler, "tool": tool, "major": major, "device_include": device_include,
            "include": include, "cudart": cudart, "check_only": mismatch, "notes": notes}


def _major_minor(version: str) -> Optional[Tuple[int, int]]:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def cudart_header_version(include_dirs: Sequence[str]) -> Optional[str]:
    """``"12.5"`` from CUDART_VERSION in the first cuda_runtime_api.h found."""
    for d in include_dirs:
        path = os.path.join(d, "cuda_runtime_api.h")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                m = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
            if m:
                v = int(m.group(1))
                return "%d.%d" % (v // 1000, (v % 1000) // 10)
    return None


def nvrtc_version(lib_path: str) -> Optional[str]:
    """``"12.5"`` from the NVRTC library itself (nvrtcVersion), or None."""
    import ctypes

    try:
        lib = ctypes.CDLL(lib_path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return "%d.%d" % (major.value, minor.value)


def version_warnings(tf_cuda_version: Optional[str], cudart: Optional[str],
                     nvrtc: Optional[str]) -> List[str]:
    """Build-time warnings where the CUDA runtime headers or the device
    compiler differ from the CUDA TensorFlow was built with
    (``tf.sysconfig.get_build_info()["cuda_version"]``)."""
    tf_v = _major_minor(tf_cuda_version or "")
    if tf_v is None:
        return []
    out = []
    for what, v in (("the CUDA runtime headers are", cudart), ("NVRTC is", nvrtc)):
        mine = _major_minor(v or "")
        if mine is None or mine == tf_v:
            continue
        if mine[0] != tf_v[0]:
            out.append("warning: %s CUDA %s but TensorFlow was built with CUDA %s: a "
                       "different major version cannot share TensorFlow's process"
                       % (what, v, tf_cuda_version))
        else:
            out.append("warning: %s CUDA %s, TensorFlow was built with CUDA %s (same major: "
                       "it works where the driver supports both; the library records both)"
                       % (what, v, tf_cuda_version))
    return out


def configure(env: Mapping[str, str], tf_cuda_version: Optional[str] = None,
              tf_include: Optional[str] = None) -> Optional[GpuConfig]:
    """None for a CPU-only build; else the GPU build's configuration."""
    ops = requested_gpu_ops(env)
    if not ops:
        return None
    major = int(tf_cuda_version.split(".")[0]) if tf_cuda_version else None
    nccl = find_nccl(env)
    cuda = find_cuda(env, major, tf_include)
    archs = _get(env, "CUDA_ARCHS") or DEFAULT_ARCHS
    if not re.fullmatch(r"\d+a?(;\d+a?)*", archs):
        raise GpuConfigError("tfhvd: %s=%s: expected architectures like 80;90"
                             % (_var(env, "CUDA_ARCHS"), archs))
    notes = list(cuda["notes"]) + version_warnings(
        tf_cuda_version, cudart_header_version(cuda["include"]),
        nvrtc_version(cuda["tool"]) if cuda["compiler"] == "nvrtc" else None)
    return GpuConfig(ops=ops, device_compiler=cuda["compiler"], device_tool=cuda["tool"],
                     cuda_major=cuda["major"], device_include=cuda["device_include"],
                     cuda_include=cuda["include"], cudart=cuda["cudart"],
                     nccl_include=nccl["include"], nccl_lib=nccl["lib"],
                     nccl_version=nccl["version"], archs=archs,
                     compile_check_only=cuda["check_only"], notes=notes)


def main(argv: List[str]) -> int:
    env = dict(os.environ)
    env.setdefault("TFHVD_GPU_OPERATIONS", "NCCL")
    try:
        cfg = configure(env)
    except GpuConfigError as e:
        print(e, file=sys.stderr)
        return 2
    if "--cmake" in argv:
        print("\n".join(cfg.cmake_args()))
    print(cfg.summary(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
