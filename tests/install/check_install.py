"""`make test-install`: tfhvd installs into a user's own environment like a library.

1. Builds an sdist of this checkout (``setup.py sdist``).
2. Makes a scratch venv that holds only TensorFlow (the version
   requirements.txt pins, from pip's cache) and a numpy other than our pin
   (``--numpy``, default 2.3.5): the user's environment.
3. Installs the sdist there the way docs/install.md says:
   ``pip install --no-build-isolation <sdist>`` (dependencies resolved by pip).
   It is unpacked into a fixed folder and built in a fixed CMake folder, so
   a second run recompiles only what changed; when the sdist's content is
   the same as last time's (hash stamp), the install is skipped altogether.
4. Checks that the user's numpy is untouched, that nothing of the project's
   own (scikit-learn, tf-keras, mpi4py, pytest) got installed, that the
   library records the venv's TensorFlow, and runs a 2-rank allreduce with
   that venv's ``tfhvdrun`` from outside the source tree.

Exit status 0 when every check passes; the first failure is printed.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What the user has and what must not appear uninvited.
NOT_INSTALLED = ("sklearn", "tf_keras", "mpi4py", "pytest")

JOB = r"""
import os, sys
import numpy as np
import tensorflow as tf
import tfhvd
import tfhvd.tensorflow as hvd
from tfhvd.common import library
prefix = os.path.realpath(sys.prefix)
assert os.path.realpath(tfhvd.__file__).startswith(prefix), ("tfhvd not from the venv", tfhvd.__file__)
assert library.built_tf_version() == tf.__version__, (library.built_tf_version(), tf.__version__)
hvd.init()
x = tf.constant([1.0 + hvd.rank(), 10.0 * (hvd.rank() + 1)])
total = hvd.allreduce(x, op=hvd.Sum).numpy()
want = sum(np.array([1.0 + r, 10.0 * (r + 1)]) for r in range(hvd.size()))
assert hvd.size() == 2 and np.array_equal(total, want), (hvd.size(), total, want)
print("INSTALL-CHECK-OK rank %d numpy %s tensorflow %s" % (hvd.rank(), np.__version__, tf.__version__))
"""


def log(msg: str) -> None:
    print("test-install: %s" % msg, flush=True)


def fail(msg: str) -> None:
    print("test-install: FAIL: %s" % msg, file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd: List[str], env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
        capture: bool = False) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env, cwd=cwd, text=True,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.STDOUT if capture else None)
    if r.returncode != 0:
        if capture:
            print(r.stdout[-6000:], file=sys.stderr)
        fail("%s exited with %d" % (" ".join(cmd), r.returncode))
    return r


def pinned(name: str) -> str:
    """The version requirements.txt pins ``name`` to."""
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.lower().startswith(name.lower() + "=="):
                return line.split("==", 1)[1]
    fail("requirements.txt pins no %s" % name)
    return ""


def clean_env() -> Dict[str, str]:
    """The environment of a user's shell: nothing of this checkout's venv or job."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_", "VIRTUAL_ENV"))
           and k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(os.path.join(ROOT, ".venv")))
    return env


def sdist_hash(path: str) -> str:
    """A hash of the sdist's file names and contents (not of the tarball,
    whose timestamps change with every build)."""
    h = hashlib.sha256()
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if m.isfile():
                h.update(m.name.encode() + b"\0")
                h.update(tar.extractfile(m).read())
    return h.hexdigest()


def build_sdist(work: str) -> str:
    dist = os.path.join(work, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    run([sys.executable, "setup.py", "-q", "sdist", "-d", dist], cwd=ROOT, capture=True)
    names = [n for n in os.listdir(dist) if n.endswith(".tar.gz")]
    if len(names) != 1:
        fail("setup.py sdist made %s" % names)
    return os.path.join(dist, names[0])


def user_venv(work: str, numpy_version: str, env: Dict[str, str]) -> str:
    """The scratch venv: TensorFlow, the user's numpy, and the build tools."""
    venv = os.path.join(work, "venv")
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".user-env")
    want = "tensorflow==%s numpy==%s" % (pinned("tensorflow"), numpy_version)
    if os.path.exists(stamp) and open(stamp).read() == want:
        # Kept from the last run: put the user's packages back as they were
        # (a no-op unless a run changed them).
        run([py, "-m", "pip", "install", "-q", "tensorflow==" + pinned("tensorflow"),
             "numpy==" + numpy_version], env=env)
        return py
    shutil.rmtree(venv, ignore_errors=True)
    log("creating the user's venv (%s)" % want)
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", venv], env=env)
    run([py, "-m", "pip", "install", "-q", "tensorflow==" + pinned("tensorflow"),
         "numpy==" + numpy_version, "setuptools>=61", "wheel"], env=env)
    with open(stamp, "w") as f:
        f.write(want)
    return py


def install(work: str, sdist: str, py: str, env: Dict[str, str]) -> bool:
    """Installs the sdist unless the same content is installed; returns
    whether it installed."""
    digest = sdist_hash(sdist)
    stamp = os.path.join(work, "venv", ".tfhvd-sdist-hash")
    if os.path.exists(stamp) and open(stamp).read() == digest:
        log("the sdist is unchanged since the last install (%s): not reinstalled" % digest[:12])
        return False
    src = os.path.join(work, "src")
    tmp = os.path.join(work, "unpack-tmp")
    for d in (src, tmp):
        shutil.rmtree(d, ignore_errors=True)
    with tarfile.open(sdist) as tar:  # keeps the files' times: CMake rebuilds what changed
        tar.extractall(tmp, filter="data")
    (top,) = os.listdir(tmp)
    os.replace(os.path.join(tmp, top), src)
    os.rmdir(tmp)
    build_env = dict(env, TFHVD_BUILD_DIR=os.path.join(work, "cmake-build"))
    # tfhvd and whatever an earlier install of it brought along.
    run([py, "-m", "pip", "uninstall", "-q", "-y", "tfhvd", "scikit-learn", "tf-keras", "mpi4py",
         "pytest"], env=env)
    log("pip install --no-build-isolation %s (unpacked in %s)" % (os.path.basename(sdist), src))
    run([py, "-m", "pip", "install", "-q", "--no-build-isolation", src], env=build_env, cwd=work)
    with open(stamp, "w") as f:
        f.write(digest)
    return True


def check(work: str, py: str, numpy_version: str, env: Dict[str, str]) -> None:
    probe = "import importlib.util, numpy; print(numpy.__version__); print(' '.join(" \
            "n for n in %r if importlib.util.find_spec(n)))" % (NOT_INSTALLED,)
    out = run([py, "-c", probe], env=env, cwd=work, capture=True).stdout.split("\n")
    if out[0].strip() != numpy_version:
        fail("installing tfhvd changed the user's numpy from %s to %s"
             % (numpy_version, out[0].strip()))
    if out[1].strip():
        fail("installing tfhvd installed what the user did not ask for: %s" % out[1].strip())
    log("numpy still %s; none of %s installed" % (numpy_version, ", ".join(NOT_INSTALLED)))
    tfhvdrun = os.path.join(os.path.dirname(py), "tfhvdrun")
    r = run([tfhvdrun, "-np", "2", py, "-c", JOB], env=env, cwd=work, capture=True)
    oks = [line for line in r.stdout.splitlines() if "INSTALL-CHECK-OK" in line]
    if len(oks) != 2:
        print(r.stdout[-6000:], file=sys.stderr)
        fail("the 2-rank job did not report from both ranks")
    log("tfhvdrun -np 2 from the venv: %s" % oks[0].split("INSTALL-CHECK-OK ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default=os.path.join(ROOT, "build", "install-check"),
                        help="scratch folder (venv, unpacked sdist, CMake build)")
    parser.add_argument("--numpy", default="2.3.5", help="the user's numpy (not our pin)")
    args = parser.parse_args()
    if args.numpy == pinned("numpy"):
        fail("--numpy %s is requirements.txt's pin; the check needs another" % args.numpy)
    start = time.monotonic()
    os.makedirs(args.work, exist_ok=True)
    env = clean_env()
    sdist = build_sdist(args.work)
    py = user_venv(args.work, args.numpy, env)
    install(args.work, sdist, py, env)
    check(args.work, py, args.numpy, env)
    log("passed in %.0f s" % (time.monotonic() - start))


if __name__ == "__main__":
    main()
