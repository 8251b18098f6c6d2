"""The network bench, short, and the scaling model's check (``make test-network``).

Correctness, not speed: a short run of scripts/network_benchmark.py on two
namespaced hosts whose links are held to 1 Gbit/s (scripts/netns_hosts.py)
must measure every method at every size, never faster than the link allows
(so the traffic did cross the limited link), train to the same weights as the
same job on one host, and leave no namespace behind, also when it is stopped
midway.  scripts/scaling_model.py --check must accept the committed bench
output with the committed calibration, and refuse a wrong calibration.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from netns_hosts import existing_namespaces, unavailable_reason  # noqa: E402

BENCH = os.path.join(ROOT, "scripts", "network_benchmark.py")
MODEL = os.path.join(ROOT, "scripts", "scaling_model.py")
BENCH_DATA = os.path.join(ROOT, "docs", "data", "network_bench.json")
CALIBRATION = os.path.join(ROOT, "docs", "data", "network_calibration.json")
SIZES = [64 * 1024, 1024 * 1024, 4 * 1024 * 1024]


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def _ours(pid: int):
    """The namespaces (and /etc/netns entries) the process ``pid`` made."""
    pat = re.compile(r"^tfhvd[A-Z]-%d-\d+$" % pid)
    left = [n for n in existing_namespaces() if pat.match(n)]
    if os.path.isdir("/etc/netns"):
        left += ["/etc/netns/" + n for n in os.listdir("/etc/netns") if pat.match(n)]
    return left


@pytest.fixture(scope="module")
def can_build():
    why = unavailable_reason(rate_mbit=1000)
    if why:
        pytest.skip(why)


def _digest_on_one_host(tmp_path) -> str:
    """The same synchronous MLP job (2 ranks) on this host, no namespaces."""
    out = str(tmp_path / "one_host.json")
    launcher = os.path.join(os.path.dirname(sys.executable), "tfhvdrun")
    launcher = [launcher] if os.path.exists(launcher) else [sys.executable, "-m",
                                                            "tfhvd.runner"]
    r = subprocess.run(launcher + ["-np", "2", sys.executable, BENCH, "--worker", "--backend",
                                   "mpi", "--out", out, "--sizes", "", "--tasks", "mlp",
                                   "--modes", "none", "--fit-repeats", "0", "--mlp-epochs", "2",
                                   "--digest"],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    with open(out) as f:
        digest = json.load(f)["fit"][0]["digest"]
    assert digest["ranks_agree"], digest
    return digest["sha256"]


def test_short_bench_across_two_hosts(can_build, tmp_path):
    out = str(tmp_path / "bench.json")
    proc = subprocess.Popen(
        [sys.executable, BENCH, "--rates", "1000", "--hosts", "2", "--backends", "mpi,gloo",
         "--fit-backends", "mpi,gloo", "--no-horovod", "--sizes", ",".join(map(str, SIZES)),
         "--repeats", "2", "--tasks", "mlp", "--modes", "none,sync,local2", "--fit-repeats", "1",
         "--mlp-epochs", "2", "--digest", "--json", out, "--timeout", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    assert _ours(proc.pid) == [], "namespaces left behind: %s" % _ours(proc.pid)
    with open(out) as f:
        record = json.load(f)
    runs = {r["backend"]: r for r in record["runs"]}
    assert sorted(runs) == ["gloo", "mpi"], list(runs)
    one_host = _digest_on_one_host(tmp_path)
    for backend, run in runs.items():
        assert run["hosts"] == 2 and run["size"] == 2 and run["rate_mbit"] == 1000
        methods = {"mpi": ["mpi4py", "eager", "grouped"], "gloo": ["eager", "grouped"]}[backend]
        got = {(row["method"], row["bytes"]): row for row in run["allreduce"]}
        assert sorted(got) == sorted((m, s) for m in methods for s in SIZES), sorted(got)
        for (method, size), row in got.items():
            assert len(row["seconds"]) == 2 and min(row["seconds"]) > 0, row
            # A 4 MiB ring allreduce on 2 ranks moves 4 MiB each way: over a
            # 1 Gbit/s link it cannot take less than ~34 ms.  Faster means the
            # bytes did not cross the limited link.
            # (Smaller sizes fit in the shaper's bucket, 125 KB, and pass faster.)
            busbw = size / min(row["seconds"]) * 8 / 1e9
            assert size < 4 * 2 ** 20 or busbw < 1.1, (backend, method, size, row["seconds"])
        (fit,) = run["fit"]
        assert sorted(fit["modes"]) == ["local2", "none", "sync"]
        for mode, v in fit["modes"].items():
            assert v["samples_per_s"][0] > 0 and 0.2 < v["val_accuracy"][0] <= 1, (mode, v)
        assert fit["digest"]["ranks_agree"], fit["digest"]
        # The same synchronous training across the network as on one host.
        assert fit["digest"]["sha256"] == one_host, (backend, fit["digest"], one_host)


def test_stopped_bench_leaves_nothing(can_build, tmp_path):
    proc = subprocess.Popen(
        [sys.executable, BENCH, "--rates", "1000", "--hosts", "3", "--backends", "gloo",
         "--no-horovod", "--sizes", str(64 * 1024 * 1024), "--repeats", "50", "--tasks", "",
         "--json", str(tmp_path / "b.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "== 3 hosts" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the bench ended early"
        spaces = [n for n in _ours(proc.pid) if not n.startswith("/")]
        assert len(spaces) == 4, spaces  # three hosts and the switch
        pids = []
        while len(pids) < 3 and time.monotonic() < deadline:  # the ranks and their sshds
            time.sleep(1)
            pids = [int(p) for ns in spaces
                    for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                            text=True).stdout.split()]
        assert pids, "nothing started in the hosts"
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM, proc.returncode
    assert _ours(proc.pid) == [], "namespaces left behind: %s" % _ours(proc.pid)
    assert not _alive(pids), "processes outlived the bench: %s" % _alive(pids)


def _alive(pids):
    out = []
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(p)
        except FileNotFoundError:
            pass
    return out


def test_scaling_model_check_accepts_committed_bench():
    r = subprocess.run([sys.executable, MODEL, "--check", BENCH_DATA], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr
    assert "checked points within" in r.stdout, r.stdout[-2000:]


def test_scaling_model_check_refuses_wrong_calibration(tmp_path):
    with open(CALIBRATION) as f:
        cal = json.load(f)
    for links in cal["links"].values():  # every link measured at half its bandwidth
        for link in links.values():
            link["bandwidth_fraction"] /= 2
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(cal))
    r = subprocess.run([sys.executable, MODEL, "--calibration", str(wrong), "--check",
                        BENCH_DATA], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "off by more than" in r.stdout
