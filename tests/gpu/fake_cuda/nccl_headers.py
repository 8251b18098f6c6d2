"""Fetches the headers of one NCCL release from its nvidia-nccl-cu12 wheel.

    python tests/gpu/fake_cuda/nccl_headers.py 2.16.2 build-gpu/nccl-2.16.2

leaves ``DEST/include/nccl.h`` (and the wheel's other headers) and nothing
else: the wheel is downloaded with pip into a scratch folder and removed.
``make test-fake-gpu`` builds the NCCL backend and the harness against the
oldest NCCL the library supports this way (the compile matrix's NCCL axis);
the fake CUDA + NCCL stands in for the library itself, so only the headers
are needed.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile


def fetch(version: str, dest: str) -> str:
    """Puts NCCL ``version``'s headers into ``dest``/include; returns nccl.h's path."""
    include = os.path.join(dest, "include")
    header = os.path.join(include, "nccl.h")
    if os.path.exists(header):
        return header
    scratch = tempfile.mkdtemp(prefix="tfhvd-nccl-wheel-")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--platform", "manylinux2014_x86_64",
                        "-d", scratch, "nvidia-nccl-cu12==" + version], check=True)
        wheels = glob.glob(os.path.join(scratch, "*.whl"))
        if len(wheels) != 1:
            raise SystemExit("expected one nvidia-nccl-cu12 %s wheel, got %r" % (version, wheels))
        staged = include + ".tmp"
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
        with zipfile.ZipFile(wheels[0]) as wheel:
            names = [n for n in wheel.namelist()
                     if n.startswith("nvidia/nccl/include/") and n.endswith(".h")]
            for name in names:
                with wheel.open(name) as src, \
                        open(os.path.join(staged, os.path.basename(name)), "wb") as out:
                    shutil.copyfileobj(src, out)
        if not os.path.exists(os.path.join(staged, "nccl.h")):
            raise SystemExit("the nvidia-nccl-cu12 %s wheel holds no nccl.h" % version)
        shutil.rmtree(include, ignore_errors=True)
        os.rename(staged, include)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="an nvidia-nccl-cu12 release, e.g. 2.16.2")
    parser.add_argument("dest", help="folder that gets include/nccl.h")
    args = parser.parse_args()
    print(fetch(args.version, args.dest))


if __name__ == "__main__":
    main()
