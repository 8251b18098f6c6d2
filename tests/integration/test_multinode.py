"""Multi-node for real, on one machine: two hosts in two network namespaces.

hostA and hostB are Linux network namespaces on one bridge
(198.18.0.1 and 198.18.0.2: RFC 2544's range for test beds), each with its
own host name (a UTS namespace) and its own sshd from Debian's
openssh-server, started with keys made for the test; scripts/netns_hosts.py
builds them (the network benchmark uses the same helper).  From hostA the test
runs ``tfhvdrun -np 4 -H hostA:2,hostB:2`` over ssh, with MPI's traffic on
the veth links over TCP, and checks the training result equals the same job
on one host.  Everything is torn down, even when the test fails.
"""

import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict

import pytest

from jobs import ROOT, TRAIN, clean_env, result_line, run, tfhvdrun

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from netns_hosts import IFNAME, SSH_PORT, NetnsHosts, unavailable_reason  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    """hostA and hostB (scripts/netns_hosts.py), each with its sshd."""
    why = unavailable_reason()
    if why:
        pytest.skip(why)
    with NetnsHosts(2, tmp=str(tmp_path)) as c:
        yield c


def _job_env(cluster: NetnsHosts) -> Dict[str, str]:
    # mpirun (and tfhvdrun's reachability check) use this ssh for the hosts.
    return clean_env({"OMPI_MCA_plm_rsh_agent": "ssh -F %s" % cluster.ssh_config,
                      "TRAIN_PROBE": "forwarded"})


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_multinode_training_equals_single_host(cluster, backend):
    # --gloo: tfhvdrun starts the remote ranks over ssh itself, Gloo's TCP
    # transport pinned to the veth interface.
    flags = ["--" + backend]
    script = [sys.executable, TRAIN, "--steps", "4", "--payload-kb", "4096"]
    before = {k: cluster.counter("hostB", k) for k in ("rx_bytes", "tx_bytes")}
    job = run(tfhvdrun() + flags + ["-np", "4", "-H", "hostA:2,hostB:2",
                            "-p", str(SSH_PORT), "-i", cluster.key,
                            "--network-interface", IFNAME, "--start-timeout", "20"] + script,
              prefix=cluster.in_host("hostA", []), env=_job_env(cluster), timeout=300)
    after = {k: cluster.counter("hostB", k) for k in ("rx_bytes", "tx_bytes")}
    assert job.rc == 0, job.explain()
    multi = result_line(job)
    assert multi["size"] == 4 and multi["ranks_agree"], multi
    assert multi["hosts"] == ["hostA", "hostB"], multi
    # The environment reached the ranks on the remote host too: a variable of
    # the user's own (horovodrun forwards them all), not only TFHVD_*.
    assert multi["probes"] == ["forwarded"] * 4, multi
    # Two hosts of two slots (--map-by slot): ranks 0, 1 on hostA, 2, 3 on hostB.
    assert multi["topology"] == [
        {"rank": r, "host": "hostA" if r < 2 else "hostB", "local_rank": r % 2,
         "local_size": 2, "cross_rank": r // 2, "cross_size": 2, "homogeneous": True}
        for r in range(4)], multi["topology"]
    # The 4 MB allreduce crossed the veth pair (only TCP can: they are
    # different namespaces), both ways.
    moved = {k: after[k] - before[k] for k in before}
    assert moved["rx_bytes"] > 4 * 2 ** 20 and moved["tx_bytes"] > 4 * 2 ** 20, moved

    single = run(tfhvdrun() + flags + ["-np", "4"] + script, env=clean_env(), timeout=300)
    assert single.rc == 0, single.explain()
    one = result_line(single)
    assert one["size"] == 4
    assert one["losses"] == multi["losses"]
    assert one["digest"] == multi["digest"]


def test_multinode_topology_of_uneven_hosts(cluster):
    """hostA:1, hostB:2: rank 0 alone on hostA, ranks 1 and 2 on hostB.  Cross
    ranks group the ranks of equal local rank (Horovod's rule), and the job is
    not homogeneous."""
    job = run(tfhvdrun() + ["-np", "3", "-H", "hostA:1,hostB:2", "-p", str(SSH_PORT),
                            "-i", cluster.key, "--network-interface", IFNAME,
                            "--start-timeout", "20", sys.executable, TRAIN, "--steps", "1"],
              prefix=cluster.in_host("hostA", []), env=_job_env(cluster), timeout=300)
    assert job.rc == 0, job.explain()
    topology = result_line(job)["topology"]
    expected = [("hostA", 0, 1, 0, 2), ("hostB", 0, 2, 1, 2), ("hostB", 1, 2, 0, 1)]
    assert topology == [
        {"rank": r, "host": host, "local_rank": lr, "local_size": ls, "cross_rank": cr,
         "cross_size": cs, "homogeneous": False}
        for r, (host, lr, ls, cr, cs) in enumerate(expected)], topology


def test_multinode_unreachable_port_fails_fast(cluster):
    # sshd listens on 2222: port 2223 refuses, and the launcher says so
    # before mpirun starts.
    job = run(tfhvdrun() + ["-np", "2", "-H", "hostA:1,hostB:1", "-p", "2223",
                            "-i", cluster.key, "--start-timeout", "5",
                            sys.executable, "-c", "pass"],
              prefix=cluster.in_host("hostA", []), env=_job_env(cluster), timeout=60)
    assert job.rc == 3, job.explain()
    assert "hostB" in job.err and "refused" in job.err.lower(), job.explain()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_multinode_gloo_leaves_no_rank_behind(cluster, how):
    # Ranks started over ssh by tfhvdrun --gloo end with the launcher, even
    # when it is killed outright (its ssh dies with it, and the remote guard
    # ends the rank when the connection closes).
    code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(300)"
    proc = subprocess.Popen(
        cluster.in_host("hostA", tfhvdrun() + [
            "--gloo", "-np", "2", "-H", "hostA:1,hostB:1", "-p", str(SSH_PORT), "-i",
            cluster.key, "--network-interface", IFNAME, sys.executable, "-c", code]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_job_env(cluster),
        cwd=ROOT, start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            m = re.search(r"<stdout>:pid (\d+)", proc.stdout.readline())
            if m:
                pids.append(int(m.group(1)))
        assert len(pids) == 2, "the ranks never started"
        # The launcher is the Python under `ip netns exec ... unshare`: find it.
        launcher = _descendant_running(proc.pid, "tfhvd")
        os.kill(launcher, how)
        deadline = time.monotonic() + 30
        while _alive(pids) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not _alive(pids), "ranks %s outlived the launcher" % _alive(pids)
    finally:
        for p in _alive(pids):
            os.kill(p, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


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


def _descendant_running(root: int, needle: str) -> int:
    """The first process below ``root`` (itself included) whose command line
    has ``needle``."""
    todo = [root]
    while todo:
        pid = todo.pop(0)
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if needle.encode() in f.read():
                    return pid
            with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                todo += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
    raise AssertionError("no process running %s below %d" % (needle, root))
