"""Which hosts an elastic job may use now: the discovery script, and the
blacklist of hosts whose workers failed.

The discovery script is any executable; each line it prints is ``host:slots``
or a bare ``host`` (which gets ``--slots-per-host`` slots).  An empty output
means no host is available right now.  The driver runs it every second.

A host whose worker fails is blacklisted.  Without ``--blacklist-cooldown-range``
it stays out for the rest of the job; with ``LOW,HIGH`` (seconds) it may come
back after a cooldown that starts at about ``2*LOW`` and doubles with each new
failure, never above ``HIGH``, plus up to ``LOW`` of random jitter (Horovod's rule).
"""

import random
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from tfhvd.common.elastic_worker import HostUpdateResult
from tfhvd.runner.hosts import HostError, _parse_name

COOLDOWN_LOWER_BOUND_S = 1
COOLDOWN_UPPER_BOUND_S = 3600
DISCOVERY_TIMEOUT_S = 30.0


def parse_discovery_output(text: str, default_slots: Optional[int],
                           where: str = "the host discovery script") -> Dict[str, int]:
    """``{host: slots}`` from a discovery script's output (raises HostError)."""
    hosts: Dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        ctx = "%s, line %d" % (where, n)
        if ":" in line:
            name, _, slots_text = line.rpartition(":")
            if not slots_text.strip().isdigit() or int(slots_text) < 1:
                raise HostError("%s: slots must be a whole number >= 1, got %r" % (ctx, line))
            slots = int(slots_text)
        else:
            if default_slots is None:
                raise HostError("%s: %r has no slot count; print host:slots or pass "
                                "--slots-per-host" % (ctx, line))
            name, slots = line, default_slots
        name = _parse_name(name.strip(), ctx)
        if name in hosts:
            raise HostError("%s: host %r is listed twice" % (ctx, name))
        hosts[name] = slots
    return hosts


class HostDiscovery:
    """Where the available hosts come from."""

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        raise NotImplementedError()


class HostDiscoveryScript(HostDiscovery):
    """Runs ``script`` (a shell command line) and parses what it prints."""

    def __init__(self, script: str, slots: Optional[int] = None,
                 timeout: float = DISCOVERY_TIMEOUT_S) -> None:
        self.script = script
        self.default_slots = slots
        self.timeout = timeout

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        try:
            proc = subprocess.run(self.script, shell=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise HostError("the host discovery script %r did not finish within %g s"
                            % (self.script, self.timeout)) from None
        if proc.returncode != 0:
            raise HostError("the host discovery script %r failed with exit code %d: %s"
                            % (self.script, proc.returncode,
                               proc.stderr.decode(errors="replace").strip()[-500:]))
        return parse_discovery_output(proc.stdout.decode(errors="replace"), self.default_slots,
                                      "the host discovery script %r" % self.script)


class FixedHosts(HostDiscovery):
    """A host list that changes only when told to (tests, ``-H`` with --min-np)."""

    def __init__(self, host_slots: Dict[str, int]) -> None:
        self._host_slots = dict(host_slots)

    def set(self, host_slots: Dict[str, int]) -> None:
        self._host_slots = dict(host_slots)

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        return dict(self._host_slots)


def parse_cooldown_range(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``LOW,HIGH`` seconds (``--blacklist-cooldown-range LOW HIGH``), or None."""
    if text is None or text == "":
        return None
    parts = [p.strip() for p in str(text).replace(" ", ",").split(",") if p.strip()]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError("--blacklist-cooldown-range takes LOW,HIGH in whole seconds, got %r"
                         % (text,))
    low, high = int(parts[0]), int(parts[1])
    if low < COOLDOWN_LOWER_BOUND_S or high > COOLDOWN_UPPER_BOUND_S or low > high:
        raise ValueError("--blacklist-cooldown-range %r: need %d <= LOW <= HIGH <= %d"
                         % (text, COOLDOWN_LOWER_BOUND_S, COOLDOWN_UPPER_BOUND_S))
    return low, high


@dataclass
class HostState:
    """Blacklist state of one host."""

    cooldown: Optional[Tuple[int, int]] = None
    blacklisted: bool = False
    count: int = 0
    until: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def blacklist(self, now: float) -> None:
        if self.blacklisted and self.until > now:
            return
        self.blacklisted = True
        if self.cooldown is None:
            return
        low, high = self.cooldown
        self.count += 1
        delay = low * (1 << self.count) + self.rng.uniform(0, 1) * low
        self.until = now + max(low, min(high, delay))

    def resurrected(self, now: float) -> bool:
        """Blacklisted, but its cooldown is over."""
        return self.blacklisted and self.cooldown is not None and now >= self.until

    def available(self, now: float) -> bool:
        return not self.blacklisted or self.resurrected(now)


class HostManager:
    """The available hosts, in the order they first appeared (older hosts
    first, so that their workers keep the lower ranks), without blacklisted
    ones whose cooldown is not over."""

    def __init__(self, discovery: HostDiscovery, cooldown: Optional[Tuple[int, int]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.discovery = discovery
        self.cooldown = cooldown
        self.clock = clock
        self._states: Dict[str, HostState] = {}
        self._order: List[str] = []
        self._slots: Dict[str, int] = {}
        self._available: Dict[str, int] = {}

    def _state(self, host: str) -> HostState:
        if host not in self._states:
            self._states[host] = HostState(self.cooldown)
        return self._states[host]

    def update_available_hosts(self) -> HostUpdateResult:
        """Runs discovery once; says whether usable hosts or slots were added
        or removed since the last call (a host back from its cooldown counts
        as added)."""
        found = self.discovery.find_available_hosts_and_slots()
        now = self.clock()
        for host in found:
            if host not in self._order:
                self._order.append(host)
            st = self._state(host)
            if st.resurrected(now):
                st.blacklisted = False  # back; a new failure doubles its cooldown
        self._slots = dict(found)
        usable = {h: s for h, s in found.items() if self._state(h).available(now)}
        res = HostUpdateResult.no_update
        for host, slots in self._available.items():
            if usable.get(host, 0) < slots:
                res |= HostUpdateResult.removed
        for host, slots in usable.items():
            if slots > self._available.get(host, 0):
                res |= HostUpdateResult.added
        self._available = usable
        return res

    def blacklist(self, host: str) -> None:
        self._state(host).blacklist(self.clock())
        self._available.pop(host, None)

    def is_blacklisted(self, host: str) -> bool:
        st = self._states.get(host)
        return bool(st and not st.available(self.clock()))

    def discovered_hosts(self) -> List[Tuple[str, int]]:
        """``[(host, slots)]`` as discovery last gave them, blacklisted ones included."""
        return [(h, self._slots[h]) for h in self._order if h in self._slots]

    def blacklisted_hosts(self) -> List[Tuple[str, Optional[float]]]:
        """Discovered hosts blacklisted now, each with the seconds left of its
        cooldown (None: blacklisted for the rest of the job)."""
        now = self.clock()
        out: List[Tuple[str, Optional[float]]] = []
        for host, _ in self.discovered_hosts():
            st = self._states.get(host)
            if st is not None and not st.available(now):
                out.append((host, max(0.0, st.until - now) if st.cooldown else None))
        return out

    def current_hosts(self) -> List[Tuple[str, int]]:
        """``[(host, slots)]`` usable now, older hosts first."""
        return [(h, self._available[h]) for h in self._order if h in self._available]

    def available_slots(self) -> int:
        return sum(s for _, s in self.current_hosts())
