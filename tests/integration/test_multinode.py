"""Multi-node for real, on one machine: two hosts in two network namespaces.

hostA and hostB are Linux network namespaces joined by a veth pair
(198.18.0.1 and 198.18.0.2: RFC 2544's range for test beds), each with its
own host name (a UTS namespace) and its own sshd from Debian's
openssh-server, started with keys this test generates.  From hostA the test
runs ``tfhvdrun -np 4 -H hostA:2,hostB:2`` over ssh, with MPI's traffic on
the veth pair over TCP, and checks the training result equals the same job
on one host.  Everything is torn down, even when the test fails.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from jobs import ROOT, TRAIN, clean_env, result_line, run, tfhvdrun

ADDR = {"hostA": "198.18.0.1", "hostB": "198.18.0.2"}
IFNAME = "tfhvd0"
SSH_PORT = 2222


def _skip_reason() -> str:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces and start sshd"
    for tool in ("ip", "unshare", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return "needs %s" % tool
    if not os.path.exists("/usr/sbin/sshd"):
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install_sshd.sh")],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not os.path.exists("/usr/sbin/sshd"):
            return "sshd (openssh-server) is missing and could not be installed: %s" % (
                r.stderr.strip()[-300:])
    probe = "tfhvd-probe-%d" % os.getpid()
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot create network namespaces here: %s" % r.stderr.strip()
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _sh(*cmd: str) -> None:
    subprocess.run(list(cmd), check=True, capture_output=True, text=True, timeout=30)


def _counter(ns: str, name: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat",
                          "/sys/class/net/%s/statistics/%s" % (IFNAME, name)],
                         capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout)


class Cluster:
    """Two namespaced hosts with sshd; ``close()`` removes all of it."""

    def __init__(self, tmp: str) -> None:
        tag = str(os.getpid())
        self.tmp = tmp
        self.ns = {"hostA": "tfhvdA-" + tag, "hostB": "tfhvdB-" + tag}
        self.sshd: List[subprocess.Popen] = []
        self.key = os.path.join(tmp, "id_ed25519")
        self.ssh_config = os.path.join(tmp, "ssh_config")

    def start(self) -> None:
        a, b = self.ns["hostA"], self.ns["hostB"]
        for ns in (a, b):
            _sh("ip", "netns", "add", ns)
            # `ip netns exec` shows /etc/netns/NS/hosts as /etc/hosts inside.
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % ns, "w") as f:
                f.write("127.0.0.1 localhost\n")
                for host, addr in ADDR.items():
                    f.write("%s %s\n" % (addr, host))
        va, vb = "tfA%s" % os.getpid(), "tfB%s" % os.getpid()
        _sh("ip", "link", "add", va[:15], "type", "veth", "peer", "name", vb[:15])
        for host, ns, dev in (("hostA", a, va[:15]), ("hostB", b, vb[:15])):
            _sh("ip", "link", "set", dev, "netns", ns)
            _sh("ip", "-n", ns, "link", "set", dev, "name", IFNAME)
            _sh("ip", "-n", ns, "addr", "add", ADDR[host] + "/24", "dev", IFNAME)
            _sh("ip", "-n", ns, "link", "set", IFNAME, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        hostkey = os.path.join(self.tmp, "hostkey")
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostkey)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key)
        auth = os.path.join(self.tmp, "authorized_keys")
        shutil.copy(self.key + ".pub", auth)
        os.chmod(auth, 0o600)
        with open(os.path.join(self.tmp, "sshd_config"), "w") as f:
            f.write("Port %d\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin "
                    "prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication "
                    "no\nUsePAM no\nStrictModes no\nPidFile none\n" % (SSH_PORT, hostkey, auth))
        with open(self.ssh_config, "w") as f:
            f.write("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                    "  LogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for host in ("hostA", "hostB"):
            log = open(os.path.join(self.tmp, "sshd-%s.log" % host), "w")
            self.sshd.append(subprocess.Popen(
                self.in_host(host, ["/usr/sbin/sshd", "-D", "-e", "-f",
                                    os.path.join(self.tmp, "sshd_config")]),
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while True:
            r = subprocess.run(self.in_host("hostA", self.ssh_command("hostB") + ["hostname"]),
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0 and r.stdout.strip() == "hostB":
                break
            if time.monotonic() > deadline:
                raise RuntimeError("sshd on hostB never answered: %s %s" % (r.stdout, r.stderr))
            time.sleep(0.3)

    def in_host(self, host: str, cmd: List[str]) -> List[str]:
        """``cmd`` run on ``host``: in its network namespace, with its host name."""
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host] + cmd

    def ssh_command(self, host: str) -> List[str]:
        return ["ssh", "-F", self.ssh_config, "-o", "BatchMode=yes", "-p", str(SSH_PORT),
                "-i", self.key, host]

    def close(self) -> None:
        for p in self.sshd:
            p.terminate()
        for p in self.sshd:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in self.ns.values():
            # Deleting a namespace deletes its end of the veth pair, and so both.
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)
        try:
            os.rmdir("/etc/netns")  # only when empty: others' entries stay
        except OSError:
            pass


@pytest.fixture
def cluster(tmp_path):
    why = _skip_reason()
    if why:
        pytest.skip(why)
    c = Cluster(str(tmp_path))
    try:
        c.start()
        yield c
    finally:
        c.close()


def _job_env(cluster: Cluster) -> Dict[str, str]:
    # mpirun (and tfhvdrun's reachability check) use this ssh for the hosts.
    return clean_env({"OMPI_MCA_plm_rsh_agent": "ssh -F %s" % cluster.ssh_config,
                      "TFHVD_TEST_PROBE": "forwarded"})


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_multinode_training_equals_single_host(cluster, backend):
    # --gloo: tfhvdrun starts the remote ranks over ssh itself, Gloo's TCP
    # transport pinned to the veth interface.
    flags = ["--" + backend]
    script = [sys.executable, TRAIN, "--steps", "4", "--payload-kb", "4096"]
    before = {k: _counter(cluster.ns["hostB"], k) for k in ("rx_bytes", "tx_bytes")}
    job = run(tfhvdrun() + flags + ["-np", "4", "-H", "hostA:2,hostB:2",
                            "-p", str(SSH_PORT), "-i", cluster.key,
                            "--network-interface", IFNAME, "--start-timeout", "20"] + script,
              prefix=cluster.in_host("hostA", []), env=_job_env(cluster), timeout=300)
    after = {k: _counter(cluster.ns["hostB"], k) for k in ("rx_bytes", "tx_bytes")}
    assert job.rc == 0, job.explain()
    multi = result_line(job)
    assert multi["size"] == 4 and multi["ranks_agree"], multi
    assert multi["hosts"] == ["hostA", "hostB"], multi
    # The environment reached the ranks on the remote host too.
    assert multi["probes"] == ["forwarded"] * 4, multi
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
