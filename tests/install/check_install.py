"""`make test-install`: tfhvd installs into a user's own environment like a library.

1. Builds an sdist of this checkout (``setup.py sdist``).
2. For each user environment below, makes a scratch venv that holds only
   that TensorFlow (and what it brings), and installs the sdist there the way
   docs/install.md says: ``pip install --no-build-isolation <sdist>[extras]``
   (dependencies resolved by pip).  Each is unpacked into a fixed folder and
   built in a fixed CMake folder, so a second run recompiles only what
   changed; when the sdist's content is the same as last time's (hash
   stamp), the install is skipped altogether.

   * TensorFlow 2.21 (the pin) with numpy 2.3.5, no extras: numpy,
     TensorFlow and Keras untouched, nothing of the project's own
     (scikit-learn, tf-keras, mpi4py, pytest) installed.
   * TensorFlow 2.16.2 with the ``[tf-keras]`` extra: TensorFlow, numpy,
     protobuf, h5py, ml_dtypes and Keras untouched, tf-keras 2.16 installed,
     the metadata requires ``tensorflow>=2.16,<2.17``.
   * TensorFlow 2.22.0rc0 (keras-nightly): ``pip install --dry-run --report``
     of the sdist with the ``[examples]`` extra (nothing compiled) would
     install neither keras nor TensorFlow, numpy or protobuf, and the
     metadata requires ``tensorflow>=2.22.0rc0,<2.23``.
3. In the first two, the library records the venv's TensorFlow and a 2-rank
   allreduce runs with that venv's ``tfhvdrun`` from outside the source tree.

``--only NAME`` runs one environment (tf221, tf216, tf222).  Exit status 0
when every check passes; the first failure is printed.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

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


@dataclass
class UserEnv:
    """A user's environment: what is in it before tfhvd, and how tfhvd goes in."""

    name: str
    packages: List[str]          # pip requirements of the venv, before tfhvd
    extras: str = ""             # "[tf-keras]" and the like
    dry_run: bool = False        # resolve only (no compile, no job)
    watched: Tuple[str, ...] = ("tensorflow", "numpy", "keras", "protobuf")
    not_installed: Tuple[str, ...] = ()
    requires: str = ""           # a Requires-Dist line the installed tfhvd must have
    arrives: Tuple[Tuple[str, str], ...] = ()  # (distribution, version prefix) it must add


def environments(numpy_version: str) -> List[UserEnv]:
    tf = pinned("tensorflow")
    return [
        UserEnv("tf221", ["tensorflow==" + tf, "numpy==" + numpy_version],
                not_installed=NOT_INSTALLED),
        UserEnv("tf216", ["tensorflow==2.16.2"], extras="[tf-keras]",
                watched=("tensorflow", "numpy", "keras", "protobuf", "h5py", "ml-dtypes"),
                not_installed=("sklearn", "mpi4py", "pytest"),
                requires="tensorflow<2.17,>=2.16", arrives=(("tf-keras", "2.16."),)),
        UserEnv("tf222", ["tensorflow==2.22.0rc0"], extras="[examples]", dry_run=True,
                watched=("tensorflow", "numpy", "keras-nightly", "keras", "protobuf"),
                requires="tensorflow<2.23,>=2.22.0rc0"),
    ]


def versions(py: str, names: Sequence[str], env: Dict[str, str], cwd: str) -> Dict[str, str]:
    """Installed versions of distributions ``names`` ("" when absent)."""
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for n in sys.argv[1:]:\n"
            "    try:\n"
            "        out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError:\n"
            "        out[n] = ''\n"
            "print(json.dumps(out))\n")
    r = run([py, "-c", code] + list(names), env=env, cwd=cwd, capture=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def user_venv(work: str, u: UserEnv, env: Dict[str, str]) -> str:
    """The scratch venv of ``u``: its packages, and the build tools."""
    venv = os.path.join(work, "venv" if u.name == "tf221" else "venv-" + u.name)
    py = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".user-env")
    want = " ".join(u.packages)
    if os.path.exists(stamp) and open(stamp).read() == want:
        # Kept from the last run: put the user's packages back as they were
        # (a no-op unless a run changed them).
        run([py, "-m", "pip", "install", "-q"] + u.packages, env=env)
        return py
    shutil.rmtree(venv, ignore_errors=True)
    log("%s: creating the user's venv (%s)" % (u.name, want))
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", venv], env=env)
    run([py, "-m", "pip", "install", "-q"] + u.packages + ["setuptools>=61", "wheel"], env=env)
    with open(stamp, "w") as f:
        f.write(want)
    return py


def unpack(work: str, sdist: str, name: str) -> str:
    """The sdist unpacked into ``work/src-NAME`` (one tree per venv: each
    keeps its own in-tree build output)."""
    src = os.path.join(work, "src-" + name)
    tmp = os.path.join(work, "unpack-tmp")
    for d in (src, tmp):
        shutil.rmtree(d, ignore_errors=True)
    with tarfile.open(sdist) as tar:  # keeps the files' times: CMake rebuilds what changed
        tar.extractall(tmp, filter="data")
    (top,) = os.listdir(tmp)
    os.replace(os.path.join(tmp, top), src)
    os.rmdir(tmp)
    return src


def install(work: str, sdist: str, u: UserEnv, py: str, env: Dict[str, str]) -> None:
    """Installs the sdist (with ``u``'s extras) unless the same content is installed."""
    digest = sdist_hash(sdist)
    stamp = os.path.join(os.path.dirname(os.path.dirname(py)), ".tfhvd-sdist-hash")
    if os.path.exists(stamp) and open(stamp).read() == digest:
        log("%s: the sdist is unchanged since the last install (%s): not reinstalled"
            % (u.name, digest[:12]))
        return
    src = unpack(work, sdist, u.name)
    build_env = dict(env, TFHVD_BUILD_DIR=os.path.join(work, "cmake-build-" + u.name))
    # tfhvd and whatever an earlier install of it brought along.
    run([py, "-m", "pip", "uninstall", "-q", "-y", "tfhvd", "scikit-learn", "tf-keras", "mpi4py",
         "pytest"], env=env)
    log("%s: pip install --no-build-isolation %s%s" % (u.name, os.path.basename(sdist), u.extras))
    run([py, "-m", "pip", "install", "-q", "--no-build-isolation", src + u.extras],
        env=build_env, cwd=work)
    with open(stamp, "w") as f:
        f.write(digest)


def check_untouched(u: UserEnv, before: Dict[str, str], after: Dict[str, str]) -> None:
    moved = ["%s %s -> %s" % (n, before[n] or "(none)", after[n] or "(none)")
             for n in u.watched if before[n] != after[n]]
    if moved:
        fail("%s: installing tfhvd%s changed the user's packages: %s"
             % (u.name, u.extras, "; ".join(moved)))
    log("%s: untouched: %s" % (u.name, ", ".join("%s %s" % (n, before[n])
                                                 for n in u.watched if before[n])))


def check_requires(u: UserEnv, requires: Sequence[str]) -> None:
    if u.requires and not any(r.replace(" ", "").startswith(u.requires) for r in requires):
        fail("%s: tfhvd's metadata does not require %s: %s" % (u.name, u.requires, requires))


def dry_run(work: str, sdist: str, u: UserEnv, py: str, env: Dict[str, str]) -> None:
    """What pip would install with the sdist: resolved, not compiled."""
    src = unpack(work, sdist, u.name)
    report = os.path.join(work, "report-%s.json" % u.name)
    log("%s: pip install --dry-run --no-build-isolation %s%s"
        % (u.name, os.path.basename(sdist), u.extras))
    run([py, "-m", "pip", "install", "-q", "--dry-run", "--no-build-isolation", "--report",
         report, src + u.extras], env=env, cwd=work, capture=True)
    with open(report) as f:
        items = json.load(f)["install"]
    names = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
             for i in items}
    moved = sorted("%s %s" % (n, names[n]) for n in u.watched if n in names)
    if moved:
        fail("%s: installing tfhvd%s would install %s" % (u.name, u.extras, ", ".join(moved)))
    mine = [i for i in items if i["metadata"]["name"].lower() == "tfhvd"]
    if not mine:
        fail("%s: the report holds no tfhvd: %s" % (u.name, sorted(names)))
    check_requires(u, mine[0]["metadata"].get("requires_dist", []))
    log("%s: would install %s; none of %s" % (u.name, ", ".join(sorted(names)),
                                              ", ".join(u.watched)))


def check(work: str, u: UserEnv, py: str, env: Dict[str, str]) -> None:
    probe = "import importlib.util; print(' '.join(" \
            "n for n in %r if importlib.util.find_spec(n)))" % (u.not_installed,)
    out = run([py, "-c", probe], env=env, cwd=work, capture=True).stdout.strip()
    if out:
        fail("%s: installing tfhvd installed what the user did not ask for: %s" % (u.name, out))
    got = versions(py, [n for n, _ in u.arrives], env, work)
    for n, prefix in u.arrives:
        if not got[n].startswith(prefix):
            fail("%s: the %s extra should bring %s %s*, found %r"
                 % (u.name, u.extras, n, prefix, got[n]))
    code = "import importlib.metadata as m; print('\\n'.join(m.requires('tfhvd') or []))"
    check_requires(u, run([py, "-c", code], env=env, cwd=work, capture=True).stdout.split("\n"))
    tfhvdrun = os.path.join(os.path.dirname(py), "tfhvdrun")
    r = run([tfhvdrun, "-np", "2", py, "-c", JOB], env=env, cwd=work, capture=True)
    oks = [line for line in r.stdout.splitlines() if "INSTALL-CHECK-OK" in line]
    if len(oks) != 2:
        print(r.stdout[-6000:], file=sys.stderr)
        fail("%s: the 2-rank job did not report from both ranks" % u.name)
    log("%s: tfhvdrun -np 2 from the venv: %s" % (u.name, oks[0].split("INSTALL-CHECK-OK ", 1)[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", default=os.path.join(ROOT, "build", "install-check"),
                        help="scratch folder (venvs, unpacked sdists, CMake builds)")
    parser.add_argument("--numpy", default="2.3.5", help="the user's numpy (not our pin)")
    parser.add_argument("--only", choices=("tf221", "tf216", "tf222"), help="one environment")
    args = parser.parse_args()
    if args.numpy == pinned("numpy"):
        fail("--numpy %s is requirements.txt's pin; the check needs another" % args.numpy)
    start = time.monotonic()
    os.makedirs(args.work, exist_ok=True)
    env = clean_env()
    sdist = build_sdist(args.work)
    for u in environments(args.numpy):
        if args.only and u.name != args.only:
            continue
        py = user_venv(args.work, u, env)
        before = versions(py, u.watched, env, args.work)
        if u.dry_run:
            dry_run(args.work, sdist, u, py, env)
            continue
        install(args.work, sdist, u, py, env)
        check_untouched(u, before, versions(py, u.watched, env, args.work))
        check(args.work, u, py, env)
    log("passed in %.0f s" % (time.monotonic() - start))


if __name__ == "__main__":
    main()
