"""Host lists: parsing ``-H``/``--hostfile``, telling local hosts apart, and
checking that remote hosts answer over ssh before mpirun is started.

Everything here fails with :class:`HostError`, whose message is meant to be
shown to the user as it is.
"""

import os
import re
import shlex
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

# A host name or IPv4 address (RFC 1123 labels; underscores are tolerated
# because some clusters use them), or a bracketed IPv6 address.
_NAME_RE = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])$")


class HostError(ValueError):
    """A host list or host file that cannot be used; the message says why."""


@dataclass(frozen=True)
class HostSlots:
    """One host of the job and how many processes it may run."""

    hostname: str
    slots: int

    def __str__(self) -> str:
        return "%s:%d" % (self.hostname, self.slots)


def _parse_name(name: str, where: str) -> str:
    if not _NAME_RE.match(name):
        raise HostError("%s: %r is not a valid host name" % (where, name))
    return name


def _parse_slots(text: str, where: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise HostError("%s: slots must be a whole number >= 1, got %r" % (where, text))
    return int(text)


def _merge(hosts: List[HostSlots], where: str) -> List[HostSlots]:
    seen: Dict[str, int] = {}
    for h in hosts:
        if h.hostname in seen:
            raise HostError("%s: host %r is listed twice; give it once with all of its slots"
                            % (where, h.hostname))
        seen[h.hostname] = h.slots
    if not hosts:
        raise HostError("%s: no hosts given" % where)
    return hosts


def parse_hosts(text: str) -> List[HostSlots]:
    """Parses Horovod's ``-H`` syntax: ``host1:2,host2:4``; a host without
    ``:slots`` has one slot.

    >>> parse_hosts("a:2,b")
    [HostSlots(hostname='a', slots=2), HostSlots(hostname='b', slots=1)]
    """
    where = "-H/--hosts %r" % text
    hosts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise HostError("%s: empty entry (expected host:slots,host:slots,...)" % where)
        if item.startswith("["):
            m = re.match(r"^(\[[^\]]*\])(?::(.*))?$", item)
            if not m:
                raise HostError("%s: cannot read entry %r" % (where, item))
            name, sep, slots = m.group(1), ":" if m.group(2) is not None else "", m.group(2)
        elif item.count(":") > 1:
            raise HostError("%s: write IPv6 addresses in brackets, e.g. [::1]:2" % where)
        else:
            name, sep, slots = item.partition(":")
        if not name:
            raise HostError("%s: entry %r has no host name" % (where, item))
        hosts.append(HostSlots(_parse_name(name, where),
                               _parse_slots(slots, where) if sep else 1))
    return _merge(hosts, where)


def parse_hostfile(path: str) -> List[HostSlots]:
    """Reads a host file: one host per line as ``host slots=N`` (Horovod and
    Open MPI) or ``host:N``; ``#`` starts a comment; a bare host has one slot.
    """
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise HostError("--hostfile %s: cannot read it (%s)" % (path, e.strerror or e)) from e
    hosts = []
    for n, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "--hostfile %s, line %d" % (path, n)
        fields = line.split()
        m = re.match(r"^slots=(\S+)$", fields[1]) if len(fields) == 2 else None
        if len(fields) == 1:
            hosts.extend(parse_hosts(fields[0]))
        elif m:
            hosts.append(HostSlots(_parse_name(fields[0], where), _parse_slots(m.group(1), where)))
        else:
            raise HostError("%s: expected 'host slots=N' or 'host:N', got %r" % (where, line))
    return _merge(hosts, "--hostfile %s" % path)


def total_slots(hosts: Sequence[HostSlots]) -> int:
    """The number of processes the hosts can run."""
    return sum(h.slots for h in hosts)


def format_hosts(hosts: Sequence[HostSlots]) -> str:
    """The ``-H`` value mpirun takes: ``a:2,b:2``."""
    return ",".join(str(h) for h in hosts)


def is_local_host(hostname: str) -> bool:
    """Whether ``hostname`` names this machine (in this network namespace).

    A name is local when it is ``localhost`` or this machine's host name, or
    when one of its addresses can be bound here (only addresses of local
    interfaces can).  A name that does not resolve is not local.
    """
    name = hostname.strip("[]")
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    for family, _, _, _, addr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
            return True
        except OSError:
            continue
    return False


def ssh_base_command(agent: str, port: Optional[int], identity: Optional[str]) -> List[str]:
    """The ssh command mpirun will use (``plm_rsh_agent`` plus our args).

    ``agent`` is Open MPI's ``plm_rsh_agent`` value: a command with optional
    arguments, possibly a ``:``-separated list of alternatives (the first is
    used here, as mpirun does when it exists).
    """
    cmd = shlex.split(agent.split(":")[0].strip() or "ssh")
    if port is not None:
        cmd += ["-p", str(port)]
    if identity:
        cmd += ["-i", identity]
    return cmd


def rsh_agent(env: Mapping[str, str], mpi_args: Sequence[str]) -> str:
    """The ``plm_rsh_agent`` mpirun will use: from ``--mpi-args``, else from
    ``OMPI_MCA_plm_rsh_agent`` in the environment, else ``ssh``."""
    for i, a in enumerate(mpi_args[:-2]):
        if a in ("--mca", "-mca") and mpi_args[i + 1] in ("plm_rsh_agent", "orte_rsh_agent"):
            return mpi_args[i + 2]
    return env.get("OMPI_MCA_plm_rsh_agent") or env.get("OMPI_MCA_orte_rsh_agent") or "ssh"


def check_ssh(hosts: Sequence[str], ssh_command: Sequence[str], timeout: float,
              env: Optional[Mapping[str, str]] = None) -> List[Tuple[str, str]]:
    """Runs ``ssh HOST true`` on every host at once; returns ``(host, why)``
    for each host that did not answer within ``timeout`` seconds.

    Batch mode makes ssh fail instead of asking for a password; the deadline
    holds even when a host drops packets silently.
    """
    if not hosts:
        return []
    connect = max(1, int(timeout))
    procs = {}
    for h in hosts:
        cmd = list(ssh_command) + ["-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % connect,
                                   h.strip("[]"), "true"]
        try:
            procs[h] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE,
                                        env=dict(env) if env is not None else None)
        except OSError as e:
            return [(x, "cannot run %s: %s" % (cmd[0], e.strerror or e)) for x in hosts]
    deadline = time.monotonic() + timeout
    failed = []
    for h, p in procs.items():
        try:
            _, err = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            failed.append((h, "no answer within --start-timeout %g s" % timeout))
            continue
        if p.returncode != 0:
            lines = [x for x in err.decode(errors="replace").splitlines() if x.strip()]
            failed.append((h, lines[-1].strip() if lines else "ssh exited with code %d"
                           % p.returncode))
    return failed


def remote_hosts(hosts: Sequence[HostSlots]) -> List[str]:
    """The hosts of the list that are not this machine."""
    return [h.hostname for h in hosts if not is_local_host(h.hostname)]


def default_hosts(num_proc: int) -> List[HostSlots]:
    """Without ``-H``: every process on this machine."""
    return [HostSlots("localhost", num_proc)]


def env_path(env: Mapping[str, str]) -> str:
    """PATH of ``env`` (the launcher's environment), or the system default."""
    return env.get("PATH", os.defpath)
