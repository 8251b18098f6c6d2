"""The elastic driver: forms each world (round) of an elastic job, and ends it.

Protocol, for one job:

1. At start the driver waits (up to the elastic timeout) for ``-np`` slots,
   assigns ranks (:func:`assign_members`, at most ``--max-np``) and starts one
   worker per slot.  Those workers form round 1.
2. A discovery thread polls the hosts every second.  When the world that the
   hosts would give differs from the running one, it bumps an update counter;
   workers long-polling :meth:`ElasticDriver.wait_notification` learn of it and
   raise ``HostsUpdatedInterrupt`` together at their next commit.
3. A worker that resets asks :meth:`ElasticDriver.ready` for the next world;
   a worker that exits is recorded by :meth:`ElasticDriver.worker_exited`:
   status 0 is a success (its slot is retired, never refilled: one worker
   finishing early does not end the job), anything else a failure (its host is
   blacklisted, with the cooldown if one was given).
4. When every worker of the round is ready or gone, the round is over.  If
   some are ready, the driver forms the next world: at least ``--min-np``
   slots (waiting up to the elastic timeout for them), survivors first in
   their old rank order (so they keep the lowest ranks and rank 0 holds the
   committed state), then new slots; it starts the new workers and answers
   the waiting ones.  More than ``--reset-limit`` resets end the job.
   If none is ready, the job is over: it succeeded when every worker of the
   last round returned 0.
5. A round whose workers do not all reach the reset within the elastic
   timeout of the first one that did has its stragglers stopped (failures).

The class holds no sockets and starts no processes itself: ``spawn`` and
``terminate`` are given to it, so tests drive it directly.
"""

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from tfhvd.runner.common import split_id, topology, worker_id  # noqa: F401 (re-exported)
from tfhvd.runner.elastic.discovery import HostManager
from tfhvd.common.elastic_worker import HostUpdateResult

DISCOVER_HOSTS_FREQUENCY_S = 1.0
# How often a driver waiting for slots says what it has and what it waits for.
WAIT_PROGRESS_INTERVAL_S = 5.0
ELASTIC_TIMEOUT_S = 600.0
RESET_LIMIT_MESSAGE = ("tfhvd elastic: the job was stopped because the number of resets "
                       "reached --reset-limit %d")

RUNNING, READY, SUCCESS, FAILED, LEFT = "running", "ready", "success", "failed", "left"

log = logging.getLogger("tfhvd.elastic")


def assign_members(survivors: Sequence[str], hosts: Sequence[Tuple[str, int]],
                   retired: Set[str], max_np: Optional[int]) -> List[str]:
    """The workers of the next world, in rank order.

    Survivors (in their old rank order) whose host still offers their slot
    come first; then free slots of the hosts, older hosts first, skipping
    retired ones (workers that finished); at most ``max_np`` in all.
    """
    slots = dict(hosts)
    members = [w for w in survivors if split_id(w)[1] < slots.get(split_id(w)[0], 0)]
    taken = set(members)
    for host, count in hosts:
        for index in range(count):
            wid = worker_id(host, index)
            if wid not in taken and wid not in retired:
                members.append(wid)
                taken.add(wid)
    return members[:max_np] if max_np is not None else members


@dataclass
class World:
    """One round: its members in rank order and their topology."""

    round: int
    members: List[str]
    info: Dict[str, Dict[str, int]]
    fresh: bool
    formed_seq: int


class ElasticJobFailed(RuntimeError):
    """Why the driver ended the job."""


class ElasticDriver:
    """See the module docstring.

    Args:
      hosts: the host manager (discovery plus blacklist).
      np / min_np / max_np: initial, minimum and maximum number of workers.
      spawn(worker_id, world): starts a worker for a new member of ``world``.
      terminate(worker_id): stops a running worker (it must then be reported
        to :meth:`worker_exited`).
      timeout: the elastic timeout (seconds) for slots and for stragglers.
      reset_limit: resets allowed (None: any number).
      world_env(world): variables every worker of ``world`` needs (its data
        plane's rendezvous scope); sent to workers that join it by a reset.
    """

    def __init__(self, hosts: HostManager, np: int, min_np: int, max_np: Optional[int],
                 spawn: Callable[[str, World], None], terminate: Callable[[str], None],
                 timeout: float = ELASTIC_TIMEOUT_S, reset_limit: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic,
                 world_env: Optional[Callable[[World], Dict[str, str]]] = None,
                 notice: Optional[Callable[[str], None]] = None) -> None:
        if min_np < 1 or np < min_np or (max_np is not None and max_np < np):
            raise ValueError("elastic job needs 1 <= --min-np (%d) <= -np (%d) <= --max-np (%s)"
                             % (min_np, np, max_np))
        self.hosts = hosts
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.spawn, self.terminate = spawn, terminate
        self.timeout = timeout
        self.reset_limit = reset_limit
        self.clock = clock
        self.world_env = world_env
        self.notice = notice or log.warning
        self.cond = threading.Condition()
        self.world: Optional[World] = None
        self.states: Dict[str, str] = {}      # worker -> state in the current round
        self.retired: Set[str] = set()        # finished workers: never refilled
        self.resets = 0
        self.seq = 0                          # host-update counter
        self.update = HostUpdateResult.no_update
        self.error: Optional[str] = None
        self.done = False
        self.sizes: List[int] = []            # world sizes, round by round
        self._forming = False
        self._broken_at: Optional[float] = None

    # ---- start and end -------------------------------------------------
    def start(self) -> None:
        """Waits for ``-np`` slots and starts round 1 (raises ElasticJobFailed)."""
        with self.cond:
            self._refresh_hosts()
            members = self._wait_for_members(self.np, [], "the %d slots of -np" % self.np)
            self._open_round(members, survivors=[])

    def wait(self) -> Optional[str]:
        """Blocks until the job is over; returns None on success, else the reason."""
        with self.cond:
            while not self.done:
                self.cond.wait(self._straggler_wait())
                self._stop_stragglers()
            return self.error

    def _finish(self, error: Optional[str]) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        if error:
            log.info(error)
            for w, st in self.states.items():
                if st == RUNNING:
                    self.terminate(w)
        self.cond.notify_all()

    # ---- discovery -------------------------------------------------------
    def _refresh_hosts(self) -> HostUpdateResult:
        return self.hosts.update_available_hosts()

    def poll_hosts(self) -> None:
        """One discovery pass (the discovery thread calls it every second)."""
        with self.cond:
            if self.done:
                return
            try:
                res = self._refresh_hosts()
            except Exception as e:  # noqa: BLE001 - a transient script failure
                log.warning("host discovery failed: %s", e)
                return
            if res == HostUpdateResult.no_update:
                return
            self.cond.notify_all()  # a round waiting for slots may go on
            if self.world is None or self._forming:
                return
            survivors = [w for w in self.world.members if self.states.get(w) == RUNNING]
            nxt = assign_members(survivors, self.hosts.current_hosts(), self.retired,
                                 self.max_np)
            if nxt != survivors:
                self.seq += 1
                self.update |= res
                log.info("hosts changed (%s): notifying workers", res)

    def wait_notification(self, wid: str, round_: int, since: int, wait: float) -> Dict:
        """Long poll: returns ``{"seq", "update"}`` once the hosts changed
        during the worker's round, or after ``wait`` seconds; at once with
        ``"round"`` (the current one) when the worker's round is not it."""
        deadline = self.clock() + wait
        with self.cond:
            while not self.done:
                w = self.world
                if w is not None and w.round != round_:
                    # The worker's world is gone (or not yet known to it): it asks
                    # again once it is in the current one.
                    return {"seq": since, "update": 0, "round": w.round}
                if w is not None and self.seq > max(since, w.formed_seq):
                    return {"seq": self.seq, "update": int(self.update)}
                left = deadline - self.clock()
                if left <= 0:
                    break
                self.cond.wait(left)
            return {"seq": since, "update": 0}

    # ---- workers -----------------------------------------------------------
    def ready(self, wid: str, round_: int) -> Dict:
        """A worker reset: blocks until the next world is formed; its answer."""
        with self.cond:
            w = self.world
            if self.done:
                return self._end_answer()
            if w is None or wid not in w.members or round_ != w.round:
                return {"action": "leave", "message": "worker %s is not part of round %s"
                        % (wid, round_)}
            if self.states.get(wid) == RUNNING:
                self.states[wid] = READY
                self._round_changed()
            while not self.done and self.world is w:
                self.cond.wait()
            if self.done:
                return self._end_answer()
            nw = self.world
            if wid not in nw.members:
                return {"action": "leave", "message": "host %s is no longer part of the job"
                        % split_id(wid)[0]}
            return dict(self._answer(nw, wid), action="run")

    def worker_exited(self, wid: str, code: int) -> None:
        """A worker process ended with exit status ``code``."""
        with self.cond:
            st = self.states.get(wid)
            if self.done or st not in (RUNNING, READY):
                return
            if code == 0:
                self.states[wid] = SUCCESS
                self.retired.add(wid)
            else:
                self.states[wid] = FAILED
                host = split_id(wid)[0]
                how = "was killed by signal %d" % -code if code < 0 else \
                    "failed with exit code %d" % code
                self.notice("worker %s %s: blacklisting host %s" % (wid, how, host))
                self.hosts.blacklist(host)
            self._round_changed()

    def _answer(self, world: World, wid: str) -> Dict:
        env = self.world_env(world) if self.world_env is not None else {}
        return dict(world.info[wid], round=world.round, fresh=world.fresh, env=env)

    def _end_answer(self) -> Dict:
        return {"action": "abort", "message": self.error or "tfhvd elastic: the job has ended"}

    # ---- rounds ------------------------------------------------------------
    def _round_changed(self) -> None:
        """Called with the lock held after any worker's state changed."""
        if self._broken_at is None:
            self._broken_at = self.clock()
        self.cond.notify_all()
        if self._forming or self.done or any(s == RUNNING for s in self.states.values()):
            return
        survivors = [w for w in self.world.members if self.states[w] == READY]
        if not survivors:
            failed = [w for w, s in self.states.items() if s == FAILED]
            if not failed:
                self._finish(None)
            elif len(failed) == len(self.states):
                self._finish("tfhvd elastic: every worker of the last round failed (%s)"
                             % ", ".join(failed))
            else:
                self._finish("tfhvd elastic: worker%s %s failed and no worker was left to "
                             "carry on" % ("" if len(failed) == 1 else "s", ", ".join(failed)))
            return
        self._forming = True
        threading.Thread(target=self._next_round, args=(survivors,), daemon=True,
                         name="tfhvd-elastic-round").start()

    def _next_round(self, survivors: List[str]) -> None:
        with self.cond:
            try:
                if self.reset_limit is not None and self.resets >= self.reset_limit:
                    raise ElasticJobFailed(RESET_LIMIT_MESSAGE % self.reset_limit)
                self.resets += 1
                members = self._wait_for_members(self.min_np, survivors,
                                                 "at least --min-np %d slots" % self.min_np)
                if not set(members) & set(survivors):
                    raise ElasticJobFailed(
                        "tfhvd elastic: no worker of the previous round is in the new world "
                        "(hosts %s), so no one holds the committed state"
                        % sorted({split_id(w)[0] for w in members}))
                self._open_round(members, survivors)
            except ElasticJobFailed as e:
                self._finish(str(e))
            finally:
                self._forming = False

    def _wait_for_members(self, need: int, survivors: List[str], what: str) -> List[str]:
        start = self.clock()
        deadline = start + self.timeout
        next_progress = start + WAIT_PROGRESS_INTERVAL_S
        while True:
            members = assign_members(survivors, self.hosts.current_hosts(), self.retired,
                                     self.max_np)
            if len(members) >= need:
                return members
            now = self.clock()
            if now >= next_progress and not self.done:
                self.notice(self._progress(need, len(members), what, deadline - now))
                next_progress = now + WAIT_PROGRESS_INTERVAL_S
            left = deadline - now
            if left <= 0 or self.done:
                raise ElasticJobFailed(
                    "tfhvd elastic: timed out after %g s (--elastic-timeout) waiting for %s; "
                    "%d usable (%s)" % (self.timeout, what, len(members), self._hosts_text()))
            self.cond.wait(min(left, DISCOVER_HOSTS_FREQUENCY_S))

    def _progress(self, need: int, have: int, what: str, left: float) -> str:
        """The line a driver waiting for slots prints every few seconds."""
        return ("waiting for %s: %d of %d usable (%s); "
                "%.0f s left of --elastic-timeout %g s" % (what, have, need, self._hosts_text(),
                                                           max(0.0, left), self.timeout))

    def _hosts_text(self) -> str:
        """What discovery offers, and which of those hosts are blacklisted."""
        hosts = self.hosts.discovered_hosts()
        text = "hosts from discovery: %s" % (
            ", ".join("%s:%d" % h for h in hosts) if hosts else "none")
        black = self.hosts.blacklisted_hosts()
        if black:
            text += "; blacklisted after a failure: " + ", ".join(
                "%s (back in %.0f s)" % (h, left) if left is not None else
                "%s (for the rest of the job: --blacklist-cooldown-range lets a host come "
                "back)" % h for h, left in black)
        return text

    def _open_round(self, members: List[str], survivors: List[str]) -> None:
        prev = self.world
        new = [w for w in members if w not in survivors]
        world = World(round=(prev.round + 1) if prev else 1, members=members,
                      info=topology(members), fresh=bool(new), formed_seq=self.seq)
        self.world = world
        self.states = {w: RUNNING for w in members}
        self._broken_at = None
        self.update = HostUpdateResult.no_update
        self.sizes.append(len(members))
        if prev is not None:
            self.notice("round %d: %d worker%s %s" % (world.round, len(members),
                                                     "" if len(members) == 1 else "s",
                                                     ", ".join(members)))
        for w in new:
            self.spawn(w, world)
        self.cond.notify_all()

    def _straggler_wait(self) -> Optional[float]:
        if self._broken_at is None:
            return None
        return max(0.05, self._broken_at + self.timeout - self.clock())

    def _stop_stragglers(self) -> None:
        if self.done or self._broken_at is None or self._forming:
            return
        if self.clock() - self._broken_at < self.timeout:
            return
        for w, st in list(self.states.items()):
            if st == RUNNING:
                self.notice("worker %s did not reach the reset within %g s: stopping it"
                            % (w, self.timeout))
                self.terminate(w)
        self._broken_at = self.clock()
