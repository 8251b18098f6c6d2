"""Inspects the GPU device code inside a built tfhvd library: the cubins and
PTX embedded in it (tfhvd_ops/cuda/build_device_code.py), any fatbin, and
the CUDA runtime it links.  Read from the library's bytes, not from what the
build said it did.

  python tests/gpu/check_device_code.py LIB [--require-arch 80 ...] [--require-ptx 70]
                                            [--max-cuda-major 12]

Prints one line per image and exits 1 when an architecture is missing, when
any device code (or the linked libcudart) comes from a CUDA newer than
--max-cuda-major, or when there is device code it cannot read.
"""

import argparse
import re
import struct
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

EM_CUDA = 190
# PTX ISA version -> the CUDA release that introduced it (major).
PTX_ISA_CUDA_13 = (9, 0)


@dataclass
class Image:
    kind: str            # "cubin" or "ptx"
    arch: int            # sm_XX / compute_XX
    offset: int
    tool: str            # what built it, as far as the image says
    cuda_major: Optional[int]  # None: the image does not say


def _sections(elf: bytes) -> List[Tuple[str, int, int, int]]:
    """(name, type, offset, size) of an ELF64 little-endian image."""
    shoff, = struct.unpack_from("<Q", elf, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 58)
    heads = []
    for i in range(shnum):
        name, typ, _, _, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        heads.append((name, typ, off, size))
    if not heads:
        return []
    stroff = heads[shstrndx][2]
    out = []
    for name, typ, off, size in heads:
        end = elf.index(b"\0", stroff + name)
        out.append((elf[stroff + name:end].decode(errors="replace"), typ, off, size))
    return out


def _cubin(data: bytes, at: int) -> Optional[Image]:
    if data[at + 4] != 2 or struct.unpack_from("<H", data, at + 18)[0] != EM_CUDA:
        return None
    osabi, flags = data[at + 7], struct.unpack_from("<I", data, at + 48)[0]
    shoff, = struct.unpack_from("<Q", data, at + 40)
    shentsize, shnum = struct.unpack_from("<HH", data, at + 58)
    elf = data[at:at + shoff + shentsize * shnum]
    # ELF ABI v7 (CUDA <= 12): sm in the low byte of e_flags; v8 (CUDA 13's
    # ptxas, OSABI 0x41): in the second byte.
    arch = flags & 0xFF if osabi == 0x33 else (flags >> 8) & 0xFF
    tool, major = "ptxas of CUDA <= 12 (ELF ABI v7, no toolkit note)", None
    if osabi != 0x33:
        tool, major = "CUDA 13 or newer (ELF ABI v8)", 13
    for name, _, off, size in _sections(elf):
        if name == ".note.nv.tkinfo":
            text = elf[off:off + size]
            m = re.search(rb"Cuda compilation tools, release (\d+)\.(\d+)[^\0]*", text)
            if m:
                tool, major = m.group(0).decode(), int(m.group(1))
    return Image("cubin", arch, at, tool, major)


def _ptx(data: bytes) -> List[Image]:
    out = []
    for m in re.finditer(rb"\n\.version (\d+)\.(\d+)\s*\n\.target sm_(\d+)", data):
        isa = (int(m.group(1)), int(m.group(2)))
        head = data[max(0, m.start() - 400):m.start()]
        rels = list(re.finditer(rb"// Cuda compilation tools, release (\d+)\.(\d+), V[\d.]+",
                                head))
        rel = rels[-1] if rels else None
        major = int(rel.group(1)) if rel else (13 if isa >= PTX_ISA_CUDA_13 else 12)
        tool = (rel.group(0)[3:].decode() if rel else "unknown") + ", PTX ISA %d.%d" % isa
        if isa >= PTX_ISA_CUDA_13:
            major = max(major, 13)
        out.append(Image("ptx", int(m.group(3)), m.start(), tool, major))
    return out


def inspect(path: str) -> Tuple[List[Image], List[str], List[str]]:
    """(images, problems it cannot read, the library's DT_NEEDED)."""
    with open(path, "rb") as f:
        data = f.read()
    images, problems = [], []
    pos = 1
    while True:
        at = data.find(b"\x7fELF", pos)
        if at < 0:
            break
        img = _cubin(data, at)
        if img:
            images.append(img)
        pos = at + 4
    images += _ptx(data)
    needed = []
    sections = _sections(data)
    for name, _, off, size in sections:
        if name in (".nv_fatbin", "__nv_relfatbin"):
            problems.append("a %s section (device code by a CUDA compiler's host path, "
                            "%d bytes): not the embedded-image route" % (name, size))
    dyn = [s for s in sections if s[0] == ".dynamic"]
    dynstr = [s for s in sections if s[0] == ".dynstr"]
    if dyn and dynstr:
        _, _, off, size = dyn[0]
        for i in range(0, size, 16):
            tag, val = struct.unpack_from("<qQ", data, off + i)
            if tag == 1:  # DT_NEEDED
                s = dynstr[0][2] + val
                needed.append(data[s:data.index(b"\0", s)].decode())
    return images, problems, needed


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library")
    ap.add_argument("--require-arch", type=int, action="append", default=[])
    ap.add_argument("--require-ptx", type=int, action="append", default=[])
    ap.add_argument("--max-cuda-major", type=int, default=None)
    a = ap.parse_args(argv)
    images, problems, needed = inspect(a.library)
    failures = list(problems)
    for im in images:
        print("%-5s %s_%d at 0x%x: %s" % (im.kind, "sm" if im.kind == "cubin" else "compute",
                                         im.arch, im.offset, im.tool))
        if a.max_cuda_major is not None and im.cuda_major is not None and \
                im.cuda_major > a.max_cuda_major:
            failures.append("%s for sm_%d comes from CUDA %d tools (%s)"
                            % (im.kind, im.arch, im.cuda_major, im.tool))
    print("links: %s" % ", ".join(needed))
    if not images:
        failures.append("no device code found in %s" % a.library)
    for arch in a.require_arch:
        if not any(im.kind == "cubin" and im.arch == arch for im in images):
            failures.append("no cubin for sm_%d" % arch)
    for arch in a.require_ptx:
        if not any(im.kind == "ptx" and im.arch == arch for im in images):
            failures.append("no PTX for compute_%d" % arch)
    if a.max_cuda_major is not None:
        for lib in needed:
            m = re.fullmatch(r"libcudart\.so\.(\d+)", lib)
            if m and int(m.group(1)) > a.max_cuda_major:
                failures.append("links %s (CUDA %s runtime)" % (lib, m.group(1)))
    for f in failures:
        print("FAIL: " + f)
    print("device code check: %s" % ("ok" if not failures else "%d problem(s)" % len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
