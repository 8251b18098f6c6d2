"""Compiles tfhvd's CUDA kernels (gpu_kernels.cu) to a cubin per
architecture plus PTX of the oldest, and writes them as data into a C++
file (device_images.cc) that the library links; device_kernels.cc loads
them with the driver API.  No fatbinary, no host code through a CUDA
compiler.

Compilers (``--compiler``):
  nvrtc  NVIDIA's runtime compiler library (the nvidia-cuda-nvrtc-cu12 wheel
         for TensorFlow's CUDA 12): front end and ptxas of that CUDA release,
         called through ctypes.  The default of a GPU build.
  nvcc   a CUDA toolkit's nvcc (-cubin / -ptx): TFHVD_CUDA_HOME, or the
         explicitly named compile-check fallback of another CUDA major.

Architectures (``--archs``, default :data:`DEFAULT_ARCHS`: every NVIDIA
generation TensorFlow 2.21 runs on, Volta to Blackwell) that the compiler
does not know are left out with a note; the PTX of the oldest kept one lets
any newer GPU (one the compiler predates included) compile the kernel at load
time (the driver's JIT).

Run by CMake (tfhvd_ops/cmake/TfhvdGpu.cmake) and tests/gpu/device_check.sh.
"""

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Tuple

Image = Tuple[str, int, bytes]  # kind ("cubin" | "ptx"), arch, bytes
DEFAULT_ARCHS = "70;75;80;86;89;90;100;120"
KERNEL = "tfhvd_batched_scaled_copy"  # TFHVD_BATCHED_COPY_KERNEL (gpu_kernels.h)
HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_kernels.h")


def _nvrtc(lib_path: str, source: str, includes: List[str], archs: List[int],
           defines: List[str]) -> Tuple[List[Image], str]:
    lib = ctypes.CDLL(lib_path)
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    src_dir = os.path.dirname(os.path.abspath(source))
    with open(source, "rb") as f:
        text = f.read()
    images: List[Image] = []
    release = ""
    targets = [("cubin", a) for a in archs] + [("ptx", archs[0])]
    for kind, arch in targets:
        prog = ctypes.c_void_p()
        r = lib.nvrtcCreateProgram(ctypes.byref(prog), text, os.path.basename(source).encode(),
                                   0, None, None)
        if r != 0:
            raise SystemExit("nvrtcCreateProgram: %s" % lib.nvrtcGetErrorString(r).decode())
        opts = [("--gpu-architecture=%s_%d" % ("sm" if kind == "cubin" else "compute", arch)),
                "-std=c++17", "-I" + src_dir] + ["-I" + d for d in includes] + \
               ["-D" + d for d in defines]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        r = lib.nvrtcCompileProgram(prog, len(opts), arr)
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        if r != 0:
            raise SystemExit("NVRTC failed for %s_%d: %s\n%s" % (
                kind, arch, lib.nvrtcGetErrorString(r).decode(),
                log.value.decode(errors="replace")))
        get_size, get = ((lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if kind == "cubin"
                         else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX))
        get_size(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        get(prog, buf)
        data = buf.raw
        if kind == "ptx":
            m = re.search(rb"Cuda compilation tools, release [^\n]*", data)
            release = m.group(0).decode() if m else ""
            data = data.rstrip(b"\0") + b"\0"
        images.append((kind, arch, data))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return images, "NVRTC %d.%d (%s)" % (major.value, minor.value, release or "release unknown")


def nvrtc_archs(lib_path: str) -> List[int]:
    """The sm_XX this NVRTC compiles for (nvrtcGetSupportedArchs)."""
    lib = ctypes.CDLL(lib_path)
    n = ctypes.c_int()
    if lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)) != 0:
        return []
    arr = (ctypes.c_int * n.value)()
    if lib.nvrtcGetSupportedArchs(arr) != 0:
        return []
    return sorted(set(arr))


def nvcc_archs(nvcc: str) -> List[int]:
    """The sm_XX this nvcc compiles for (``nvcc --list-gpu-code``)."""
    out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True).stdout
    return sorted({int(m.group(1)) for m in re.finditer(r"\bsm_(\d+)\b", out)})


def keep_known(archs: List[int], known: List[int], tool: str) -> List[int]:
    """``archs`` less those the compiler does not know (a note names them);
    all of them when the compiler cannot say."""
    if not known:
        return archs
    kept = [a for a in archs if a in known]
    dropped = [a for a in archs if a not in known]
    if not kept:
        raise SystemExit("%s compiles none of sm %s (it knows sm %s)" % (
            tool, " ".join(map(str, archs)), " ".join(map(str, known))))
    if dropped:
        print("tfhvd device code: %s does not know sm %s; left out (those GPUs JIT the PTX of "
              "compute_%d)" % (tool, " ".join(map(str, dropped)), kept[0]))
    return kept


def _nvcc(nvcc: str, source: str, includes: List[str], archs: List[int],
          defines: List[str]) -> Tuple[List[Image], str]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Cuda compilation tools, release [^\n]*", out)
    release = m.group(0) if m else "release unknown"
    vm = re.search(r"release (\d+\.\d+)", release)
    images: List[Image] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, arch in [("cubin", a) for a in archs] + [("ptx", archs[0])]:
            path = os.path.join(tmp, "k.%s" % kind)
            flag = ["-cubin", "-arch=sm_%d" % arch] if kind == "cubin" else \
                ["-ptx", "-arch=compute_%d" % arch]
            cmd = [nvcc, "-std=c++17", "-O3"] + flag + ["-I" + d for d in includes] + \
                  ["-D" + d for d in defines] + [source, "-o", path]
            subprocess.run(cmd, check=True)
            with open(path, "rb") as f:
                data = f.read()
            images.append((kind, arch, data.rstrip(b"\0") + b"\0" if kind == "ptx" else data))
    return images, "nvcc %s (%s)" % (vm.group(1) if vm else "?", release)


def _check(images: List[Image]) -> None:
    for kind, arch, data in images:
        if kind == "cubin" and (data[:4] != b"\x7fELF" or data[18:20] != b"\xbe\x00"):
            raise SystemExit("the compiler's sm_%d output is not a CUDA cubin" % arch)
        if kind == "ptx" and b".entry " + KERNEL.encode() not in data:
            raise SystemExit("the compiler's PTX lacks the kernel")


def render(images: List[Image], info: str) -> str:
    """The C++ source holding the images (see device_kernels.h)."""
    lines = ["// Generated by tfhvd_ops/cuda/build_device_code.py: do not edit.",
             '#include "%s"' % HEADER, "",
             "namespace tfhvd {", "namespace cuda {", "namespace {"]
    for i, (_, _, data) in enumerate(images):
        lines.append("alignas(64) const unsigned char kImage%d[] = {" % i)
        for off in range(0, len(data), 24):
            lines.append("  " + ",".join(str(b) for b in data[off:off + 24]) + ",")
        lines.append("};")
    lines += ["}  // namespace", "", "const DeviceImage kDeviceImages[] = {"]
    for i, (kind, arch, _) in enumerate(images):
        lines.append('  {"%s", %d, kImage%d, sizeof(kImage%d)},' % (kind, arch, i, i))
    # The kernel's parameter block as the device compiler laid it out must be
    # the host's CopyBatch, byte for byte (cuLaunchKernel copies sizeof).
    sizes = {int(m.group(1)) for kind, _, data in images if kind == "ptx"
             for m in re.finditer(rb"\.param \.align \d+ \.b8 " +
                                  KERNEL.encode() + rb"_param_0\[(\d+)\]", data)}
    lines.append("};")
    for size in sorted(sizes):
        lines.append('static_assert(sizeof(CopyBatch) == %d, "the device code\'s kernel parameter '
                     'is %d bytes: host and device disagree on CopyBatch");' % (size, size))
    lines += ["const int kNumDeviceImages = %d;" % len(images),
              'const char kDeviceCodeInfo[] = "%s";' % info.replace('"', "'"), "",
              "}  // namespace cuda", "}  // namespace tfhvd", ""]
    return "\n".join(lines)


def describe(images: List[Image], tool: str) -> str:
    cubins = " ".join("sm_%d" % a for k, a, _ in images if k == "cubin")
    ptx = " ".join("compute_%d" % a for k, a, _ in images if k == "ptx")
    return "%s: cubin %s, PTX %s" % (tool, cubins, ptx)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compiler", choices=("nvrtc", "nvcc"), required=True)
    ap.add_argument("--tool", required=True, help="libnvrtc.so.N or nvcc")
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("--define", action="append", default=[])
    ap.add_argument("--archs", default=DEFAULT_ARCHS)
    ap.add_argument("--source", required=True)
    ap.add_argument("--output", required=True)
    a = ap.parse_args(argv)
    archs = sorted(int(x.rstrip("a")) for x in re.split(r"[;, ]+", a.archs) if x)
    includes = [d for inc in a.include for d in inc.split(";") if d]
    build = _nvrtc if a.compiler == "nvrtc" else _nvcc
    known = nvrtc_archs(a.tool) if a.compiler == "nvrtc" else nvcc_archs(a.tool)
    archs = keep_known(archs, known, os.path.basename(a.tool))
    images, tool = build(a.tool, a.source, includes, archs, a.define)
    _check(images)
    info = describe(images, tool)
    text = render(images, info)
    old = open(a.output).read() if os.path.exists(a.output) else None
    if old != text:
        os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
        with open(a.output, "w") as f:
            f.write(text)
    print("tfhvd device code: " + info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
