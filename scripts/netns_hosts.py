"""N "hosts" on one Linux machine: network namespaces on one bridge, links held to a rate.

Used by tests/integration/test_multinode.py, tests/network/test_network.py and
scripts/network_benchmark.py (one helper, not a copy per user).  It needs
nothing from tfhvd.

    from netns_hosts import NetnsHosts, unavailable_reason

    why = unavailable_reason(rate_mbit=1000)
    if why:
        raise SystemExit(why)
    with NetnsHosts(3, rate_mbit=1000) as hosts:        # hostA, hostB, hostC
        subprocess.run(hosts.in_host("hostA", ["hostname"]))
        ...  # ssh between hosts: hosts.ssh_config, hosts.key, hosts.port

Layout.  Host i (hostA, hostB, ...) is a network namespace with address
198.18.0.(i+1)/24 (RFC 2544's range for test beds) on an interface named
``tfhvd0``, its own host name (a UTS namespace, given by ``in_host``) and,
when asked, its own sshd (Debian's openssh-server) on port 2222 with keys made
for the run.  Every host's ``tfhvd0`` is one end of a veth pair whose other end
is a port of the bridge ``br0`` in a third namespace (the "switch"), so that
nothing is added to the machine's own namespace.  With ``rate_mbit``, a ``tbf``
qdisc holds both directions of every link to that rate: the host end's egress
(what the host sends) and the switch port's egress (what it receives).  Two
hosts send to each other at the full rate at once, as on a switched network.

Teardown.  ``close()`` (the context manager's exit) stops the sshds and
deletes the namespaces, which deletes the veth pairs and the bridge with them.
It also runs at interpreter exit and on SIGTERM, SIGINT and SIGHUP, so a run
that fails or is stopped leaves nothing behind; ``remove_stale()`` removes the
namespaces of runs that were killed outright (SIGKILL), found by the pid in
their names.
"""

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

IFNAME = "tfhvd0"
SSH_PORT = 2222
SUBNET = "198.18.0."
HERE = os.path.dirname(os.path.abspath(__file__))
_NAME = re.compile(r"^tfhvd[A-Z]-(\d+)(?:-\d+)?$")


def host_names(n: int) -> List[str]:
    """hostA, hostB, ... (at most 26)."""
    if not 1 <= n <= 26:
        raise ValueError("1 to 26 hosts, not %d" % n)
    return ["host" + chr(ord("A") + i) for i in range(n)]


def _run(cmd: List[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (exit %d): %s" % (" ".join(cmd), r.returncode,
                                                        r.stderr.strip()))
    return r


def tbf_args(rate_mbit: float) -> List[str]:
    """The ``tc qdisc ... tbf`` arguments for a link of ``rate_mbit``: a bucket of
    1 ms at the rate (at least 64 KiB, so that one TSO packet fits) and a queue
    of 20 ms."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes / 1000))
    return ["tbf", "rate", "%dmbit" % rate_mbit, "burst", str(burst), "latency", "20ms"]


def unavailable_reason(rate_mbit: Optional[float] = None, sshd: bool = True,
                       install_sshd: bool = True) -> str:
    """Why namespaced hosts cannot be built here, or "" when they can.

    Checks, in order: Linux, root, the tools (ip, unshare, tc, and for
    ``sshd`` ssh and ssh-keygen), sshd itself (installed with
    scripts/install_sshd.sh when missing and ``install_sshd``), that a
    namespace can be made, and with ``rate_mbit`` that a ``tbf`` qdisc can be
    put on a veth link (sch_tbf)."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root to create network namespaces (and start sshd)"
    tools = ["ip", "unshare"] + (["tc"] if rate_mbit else []) + (
        ["ssh", "ssh-keygen"] if sshd else [])
    for tool in tools:
        if shutil.which(tool) is None:
            return "needs %s (iproute2 / util-linux / openssh-client)" % tool
    if sshd and not os.path.exists("/usr/sbin/sshd"):
        if not install_sshd:
            return "needs sshd (openssh-server)"
        r = subprocess.run(["bash", os.path.join(HERE, "install_sshd.sh")],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 or not os.path.exists("/usr/sbin/sshd"):
            return "sshd (openssh-server) is missing and could not be installed: %s" % (
                r.stderr.strip()[-300:])
    probe = "tfhvdP-%d" % os.getpid()
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot create network namespaces here (ip netns add): %s" % r.stderr.strip()
    try:
        if rate_mbit:
            r = subprocess.run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer",
                                "name", "p1"], capture_output=True, text=True)
            if r.returncode != 0:
                return "cannot create veth links here: %s" % r.stderr.strip()
            r = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root"]
                               + tbf_args(rate_mbit), capture_output=True, text=True)
            if r.returncode != 0:
                return ("cannot limit a link's rate here: the tbf qdisc (sch_tbf) is "
                        "unavailable: %s" % r.stderr.strip())
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> List[str]:
    """Deletes the namespaces (and /etc/netns entries) this module made in
    processes that no longer run, ending what still runs in them; returns
    their names."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    gone = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
            for pid in r.stdout.split():  # what the killed run left running there
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree("/etc/netns/" + name, ignore_errors=True)
            gone.append(name)
    return gone


_LIVE: List["NetnsHosts"] = []
_HANDLERS_SET = False


def _close_all() -> None:
    for hosts in list(_LIVE):
        hosts.close()


def _on_signal(signum, frame) -> None:
    _close_all()
    # Then what the signal would have done: end with the usual status.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    global _HANDLERS_SET
    if _HANDLERS_SET:
        return
    _HANDLERS_SET = True
    atexit.register(_close_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread: atexit and close() still hold
            pass


class NetnsHosts:
    """``n`` namespaced hosts on one bridge; ``close()`` removes all of it."""

    _count = 0

    def __init__(self, n: int = 2, rate_mbit: Optional[float] = None,
                 tmp: Optional[str] = None, sshd: bool = True) -> None:
        NetnsHosts._count += 1
        tag = "%d-%d" % (os.getpid(), NetnsHosts._count)
        self.names = host_names(n)
        self.addr: Dict[str, str] = {h: SUBNET + str(i + 1) for i, h in enumerate(self.names)}
        self.ns: Dict[str, str] = {h: "tfhvd%s-%s" % (h[-1], tag) for h in self.names}
        self.switch = "tfhvdS-" + tag
        self.rate_mbit = rate_mbit
        self.want_sshd = sshd
        self.port = SSH_PORT
        self._own_tmp = tmp is None
        self.tmp = tmp or _mkdtemp()
        self.key = os.path.join(self.tmp, "id_ed25519")
        self.ssh_config = os.path.join(self.tmp, "ssh_config")
        self.sshd: List[subprocess.Popen] = []
        self._made: List[str] = []
        self._closed = False

    # ------------------------------------------------------------ life cycle
    def __enter__(self) -> "NetnsHosts":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        _install_handlers()
        _LIVE.append(self)
        self._add_ns(self.switch)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for i, host in enumerate(self.names):
            ns = self.ns[host]
            self._add_ns(ns)
            # `ip netns exec` shows /etc/netns/NS/hosts as /etc/hosts inside.
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % ns, "w") as f:
                f.write("127.0.0.1 localhost\n")
                for h, addr in self.addr.items():
                    f.write("%s %s\n" % (addr, h))
            # Made inside the switch namespace, so no name can clash with the machine's.
            _run(["ip", "-n", self.switch, "link", "add", "p%d" % i, "type", "veth", "peer",
                  "name", "h%d" % i])
            _run(["ip", "-n", self.switch, "link", "set", "h%d" % i, "netns", ns])
            _run(["ip", "-n", ns, "link", "set", "h%d" % i, "name", IFNAME])
            _run(["ip", "-n", ns, "addr", "add", self.addr[host] + "/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", self.switch, "link", "set", "p%d" % i, "master", "br0"])
            _run(["ip", "-n", self.switch, "link", "set", "p%d" % i, "up"])
            if self.rate_mbit:
                tbf = tbf_args(self.rate_mbit)
                _run(["tc", "-n", ns, "qdisc", "add", "dev", IFNAME, "root"] + tbf)
                _run(["tc", "-n", self.switch, "qdisc", "add", "dev", "p%d" % i, "root"] + tbf)
        if self.want_sshd:
            self._start_sshd()

    def _add_ns(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._made.append(ns)

    def _start_sshd(self) -> None:
        hostkey = os.path.join(self.tmp, "hostkey")
        for path in (hostkey, self.key):
            if not os.path.exists(path):
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", path])
        auth = os.path.join(self.tmp, "authorized_keys")
        shutil.copy(self.key + ".pub", auth)
        os.chmod(auth, 0o600)
        conf = os.path.join(self.tmp, "sshd_config")
        with open(conf, "w") as f:
            f.write("Port %d\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin "
                    "prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication "
                    "no\nUsePAM no\nStrictModes no\nPidFile none\n" % (self.port, hostkey, auth))
        with open(self.ssh_config, "w") as f:
            f.write("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
                    "  LogLevel ERROR\n")
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        for host in self.names:
            log = open(os.path.join(self.tmp, "sshd-%s.log" % host), "w")
            self.sshd.append(subprocess.Popen(
                self.in_host(host, ["/usr/sbin/sshd", "-D", "-e", "-f", conf]),
                stdout=log, stderr=subprocess.STDOUT))
            log.close()
        first = self.names[0]
        for host in self.names[1:]:
            deadline = time.monotonic() + 20
            while True:
                r = subprocess.run(self.in_host(first, self.ssh_command(host) + ["hostname"]),
                                   capture_output=True, text=True, timeout=30)
                if r.returncode == 0 and r.stdout.strip() == host:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("sshd on %s never answered: %s %s"
                                       % (host, r.stdout, r.stderr))
                time.sleep(0.3)

    def close(self) -> None:
        """Stops the sshds and deletes every namespace; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for p in self.sshd:
            p.terminate()
        for p in self.sshd:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self._end_processes()
        for ns in self._made:
            # Deleting a namespace deletes its ends of the veth pairs, and so both.
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)
        try:
            os.rmdir("/etc/netns")  # only when empty: others' entries stay
        except OSError:
            pass
        if self._own_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if self in _LIVE:
            _LIVE.remove(self)

    def _end_processes(self) -> None:
        """Ends what still runs in the hosts (a job cut short): SIGTERM, then
        SIGKILL after 5 s."""
        def pids() -> List[int]:
            out = []
            for ns in self._made:
                r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
                out += [int(p) for p in r.stdout.split() if p.isdigit()]
            return [p for p in out if p != os.getpid()]

        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            left = pids()
            if not left:
                return
            for p in left:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while pids() and time.monotonic() < deadline:
                time.sleep(0.1)

    # ------------------------------------------------------------ using them
    def in_host(self, host: str, cmd: List[str]) -> List[str]:
        """``cmd`` run on ``host``: in its network namespace, with its host name."""
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host] + list(cmd)

    def ssh_command(self, host: str) -> List[str]:
        return ["ssh", "-F", self.ssh_config, "-o", "BatchMode=yes", "-p", str(self.port),
                "-i", self.key, host]

    def hosts_arg(self, slots: int = 1) -> str:
        """``-H`` for tfhvdrun / mpirun: ``hostA:1,hostB:1,...``."""
        return ",".join("%s:%d" % (h, slots) for h in self.names)

    def counter(self, host: str, name: str) -> int:
        """A statistic of ``host``'s ``tfhvd0`` (rx_bytes, tx_bytes, ...)."""
        out = _run(["ip", "netns", "exec", self.ns[host], "cat",
                    "/sys/class/net/%s/statistics/%s" % (IFNAME, name)])
        return int(out.stdout)

    def namespaces(self) -> List[str]:
        return [self.switch] + [self.ns[h] for h in self.names]


def _mkdtemp() -> str:
    import tempfile
    return tempfile.mkdtemp(prefix="tfhvd-netns-")


def existing_namespaces() -> List[str]:
    """The names ``ip netns list`` shows."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.split()]


_SINK = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
         "socket.SO_REUSEADDR,1);s.bind(('0.0.0.0',5999));s.listen(1);c,_=s.accept();n=0\n"
         "while True:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\nprint(n)")
_SOURCE = ("import socket,time,sys;c=socket.create_connection((sys.argv[1],5999));"
           "b=bytes(1<<20);t=time.perf_counter();[c.sendall(b) for _ in range(int(sys.argv[2]))];"
           "c.shutdown(socket.SHUT_WR);c.recv(1);print(time.perf_counter()-t)")


def tcp_rate_mbit(hosts: NetnsHosts, src: str, dst: str, mib: int = 64) -> float:
    """One TCP stream's rate from ``src`` to ``dst`` in Mbit/s (a check of the link)."""
    sink = subprocess.Popen(hosts.in_host(dst, [sys.executable, "-c", _SINK]),
                            stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(50):
            r = subprocess.run(hosts.in_host(src, [sys.executable, "-c", _SOURCE, dst,
                                                   str(mib)]),
                               capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                return mib * 2 ** 20 * 8 / float(r.stdout) / 1e6
            time.sleep(0.1)
        raise RuntimeError("no TCP connection %s -> %s: %s" % (src, dst, r.stderr))
    finally:
        sink.wait(timeout=30)


if __name__ == "__main__":
    # A look at the links: python scripts/netns_hosts.py [N] [RATE_MBIT]
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else None
    why = unavailable_reason(rate, sshd=False)
    if why:
        sys.exit("netns_hosts: " + why)
    with NetnsHosts(n, rate, sshd=False) as hosts:
        for h in hosts.names[1:]:
            print("%s -> %s: one TCP stream %.0f Mbit/s (link %s)"
                  % (hosts.names[0], h, tcp_rate_mbit(hosts, hosts.names[0], h),
                     "%g Mbit/s" % rate if rate else "unlimited"))
    print("namespaces left:", [n for n in existing_namespaces() if _NAME.match(n)])
