"""The elastic driver's logic, driven directly: no processes, no sockets.

Workers are simulated: ``spawn`` records who was started, tests call
``ready()`` (a worker's reset) in threads and ``worker_exited()`` (its
process ending), as the process layer does.
"""

import threading
import time

import pytest

from tfhvd.runner.elastic import discovery as disc
from tfhvd.runner.elastic.driver import (RESET_LIMIT_MESSAGE, ElasticDriver, assign_members,
                                         topology)
from tfhvd.common.elastic_worker import HostUpdateResult
from tfhvd.runner.hosts import HostError


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Sim:
    """A driver over fixed hosts with simulated workers."""

    def __init__(self, hosts, np, min_np=1, max_np=None, timeout=5.0, reset_limit=None,
                 cooldown=None, clock=time.monotonic):
        self.discovery = disc.FixedHosts(hosts)
        self.manager = disc.HostManager(self.discovery, cooldown, clock=clock)
        self.spawned = []
        self.terminated = []
        self.driver = ElasticDriver(self.manager, np=np, min_np=min_np, max_np=max_np,
                                    spawn=lambda w, world: self.spawned.append((w, world.round)),
                                    terminate=self.terminated.append, timeout=timeout,
                                    reset_limit=reset_limit)
        self.answers = {}

    def start(self):
        self.driver.start()
        return self

    def ready_async(self, *wids):
        rnd = self.driver.world.round
        threads = []
        for w in wids:
            t = threading.Thread(target=lambda w=w: self.answers.__setitem__(
                w, self.driver.ready(w, rnd)))
            t.start()
            threads.append(t)
        return threads

    def join(self, threads, timeout=10):
        for t in threads:
            t.join(timeout)
            assert not t.is_alive(), "a worker's ready() never returned"


def test_assign_keeps_survivors_first_and_caps_at_max_np():
    hosts = [("a", 2), ("b", 1), ("c", 2)]
    assert assign_members([], hosts, set(), None) == ["a:0", "a:1", "b:0", "c:0", "c:1"]
    # b:0 survived with rank 0: it keeps it; then the free slots, older hosts first.
    assert assign_members(["b:0", "c:1"], hosts, set(), 4) == ["b:0", "c:1", "a:0", "a:1"]
    # A survivor whose host lost the slot is dropped; retired slots are not refilled.
    assert assign_members(["a:1", "b:0"], [("a", 1), ("b", 1)], {"a:0"}, None) == ["b:0"]


def test_topology_local_and_cross_ranks():
    t = topology(["a:0", "b:0", "a:1"])
    assert t["a:0"] == dict(rank=0, size=3, local_rank=0, local_size=2, cross_rank=0,
                            cross_size=2)
    assert t["b:0"]["local_rank"] == 0 and t["b:0"]["cross_rank"] == 1
    assert t["a:1"] == dict(rank=2, size=3, local_rank=1, local_size=2, cross_rank=0,
                            cross_size=1)


def test_discovery_output_parsing_and_errors():
    assert disc.parse_discovery_output("a:2\n\nb\n# c:9\n", 3) == {"a": 2, "b": 3}
    with pytest.raises(HostError, match="no slot count"):
        disc.parse_discovery_output("a\n", None)
    with pytest.raises(HostError, match="slots must be"):
        disc.parse_discovery_output("a:0\n", None)
    with pytest.raises(HostError, match="listed twice"):
        disc.parse_discovery_output("a:1\na:2\n", None)


def test_discovery_script_runs_and_reports_failure(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho 127.0.0.2\n")
    script.chmod(0o755)
    assert disc.HostDiscoveryScript(str(script), 1).find_available_hosts_and_slots() == \
        {"localhost": 2, "127.0.0.2": 1}
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    bad.chmod(0o755)
    with pytest.raises(HostError, match="exit code 3: boom"):
        disc.HostDiscoveryScript(str(bad), 1).find_available_hosts_and_slots()


def test_cooldown_range_parsing():
    assert disc.parse_cooldown_range("2,10") == (2, 10)
    assert disc.parse_cooldown_range(None) is None
    for bad in ("0,10", "5,2", "1,99999", "x"):
        with pytest.raises(ValueError):
            disc.parse_cooldown_range(bad)


def test_blacklist_forever_without_cooldown_and_back_after_cooldown():
    clock = Clock()
    m = disc.HostManager(disc.FixedHosts({"a": 1, "b": 1}), None, clock=clock)
    m.update_available_hosts()
    m.blacklist("b")
    clock.t += 10000
    assert m.update_available_hosts() == HostUpdateResult.no_update
    assert m.current_hosts() == [("a", 1)]

    m = disc.HostManager(disc.FixedHosts({"a": 1, "b": 1}), (2, 10), clock=clock)
    m.update_available_hosts()
    m.blacklist("b")
    assert m.current_hosts() == [("a", 1)] and m.is_blacklisted("b")
    clock.t += 1.5  # the first cooldown is at least 2*LOW (4 s), capped by HIGH
    assert m.update_available_hosts() == HostUpdateResult.no_update
    clock.t += 10
    assert m.update_available_hosts() == HostUpdateResult.added
    assert m.current_hosts() == [("a", 1), ("b", 1)] and not m.is_blacklisted("b")
    # A second failure doubles the cooldown (up to HIGH).
    m.blacklist("b")
    first_until = m._states["b"].until - clock.t
    assert 2 <= first_until <= 10


def test_host_update_flags():
    fixed = disc.FixedHosts({"a": 1})
    m = disc.HostManager(fixed)
    assert m.update_available_hosts() == HostUpdateResult.added
    fixed.set({"a": 2, "b": 1})
    assert m.update_available_hosts() == HostUpdateResult.added
    fixed.set({"a": 1, "c": 1})
    assert m.update_available_hosts() == HostUpdateResult.mixed
    fixed.set({"c": 1})
    assert m.update_available_hosts() == HostUpdateResult.removed
    assert m.current_hosts() == [("c", 1)]


def test_start_spawns_np_and_success_ends_the_job():
    sim = Sim({"a": 2, "b": 1}, np=3).start()
    assert [w for w, _ in sim.spawned] == ["a:0", "a:1", "b:0"]
    for w in ("a:0", "a:1", "b:0"):
        sim.driver.worker_exited(w, 0)
    assert sim.driver.wait() is None
    assert sim.driver.sizes == [3]


def test_lost_worker_forms_a_smaller_world_survivors_keep_ranks():
    sim = Sim({"a": 1, "b": 1, "c": 1}, np=3, min_np=2).start()
    sim.driver.worker_exited("a:0", -9)   # rank 0 is SIGKILLed
    threads = sim.ready_async("b:0", "c:0")
    sim.join(threads)
    assert sim.answers["b:0"]["action"] == "run"
    assert (sim.answers["b:0"]["rank"], sim.answers["c:0"]["rank"]) == (0, 1)
    assert sim.answers["b:0"]["size"] == 2 and not sim.answers["b:0"]["fresh"]
    assert sim.manager.is_blacklisted("a")
    assert sim.driver.world.round == 2 and sim.driver.sizes == [3, 2]


def test_one_worker_finishing_early_does_not_end_the_job():
    sim = Sim({"a": 1, "b": 1, "c": 1}, np=3).start()
    sim.driver.worker_exited("b:0", 0)   # done early (Horovod #3852 ends the job here)
    threads = sim.ready_async("a:0", "c:0")
    sim.join(threads)
    assert not sim.driver.done
    assert sim.driver.world.members == ["a:0", "c:0"]   # b's slot is not refilled
    assert len(sim.spawned) == 3
    sim.driver.worker_exited("a:0", 0)
    sim.driver.worker_exited("c:0", 0)
    assert sim.driver.wait() is None


def test_every_worker_failing_ends_with_an_error():
    sim = Sim({"a": 1, "b": 1}, np=2).start()
    sim.driver.worker_exited("a:0", 1)
    sim.driver.worker_exited("b:0", 1)
    assert "every worker of the last round failed" in sim.driver.wait()


def test_fewer_than_min_np_times_out_with_an_error_not_a_hang():
    sim = Sim({"a": 1, "b": 1, "c": 1}, np=3, min_np=3, timeout=1.0).start()
    sim.driver.worker_exited("c:0", 1)
    t0 = time.monotonic()
    threads = sim.ready_async("a:0", "b:0")
    sim.join(threads)
    assert time.monotonic() - t0 < 5
    assert sim.answers["a:0"]["action"] == "abort"
    assert "timed out after 1 s" in sim.answers["a:0"]["message"]
    assert "at least --min-np 3" in sim.driver.wait()


def test_new_host_joins_on_reset_and_is_spawned():
    sim = Sim({"a": 1}, np=1, max_np=3).start()
    sim.discovery.set({"a": 1, "b": 2})
    sim.driver.poll_hosts()
    note = sim.driver.wait_notification("a:0", 1, 0, 0.1)
    assert note["seq"] == 1 and note["update"] == int(HostUpdateResult.added)
    threads = sim.ready_async("a:0")
    sim.join(threads)
    assert sim.answers["a:0"]["rank"] == 0 and sim.answers["a:0"]["fresh"]
    assert [w for w, r in sim.spawned if r == 2] == ["b:0", "b:1"]
    # A newcomer's long poll does not see the update its world already absorbed.
    assert sim.driver.wait_notification("b:0", 2, 0, 0.1)["seq"] == 0


def test_no_notification_when_the_world_would_not_change():
    sim = Sim({"a": 1}, np=1, max_np=1).start()
    sim.discovery.set({"a": 1, "b": 1})
    sim.driver.poll_hosts()
    assert sim.driver.wait_notification("a:0", 1, 0, 0.1)["seq"] == 0


def test_removed_host_worker_is_told_to_leave():
    sim = Sim({"a": 1, "b": 1}, np=2).start()
    sim.discovery.set({"a": 1})
    sim.driver.poll_hosts()
    assert sim.driver.wait_notification("a:0", 1, 0, 0.1)["update"] == \
        int(HostUpdateResult.removed)
    threads = sim.ready_async("a:0", "b:0")
    sim.join(threads)
    assert sim.answers["a:0"]["action"] == "run" and sim.answers["a:0"]["size"] == 1
    assert sim.answers["b:0"]["action"] == "leave"


def test_reset_limit_stops_the_job():
    sim = Sim({"a": 1, "b": 1, "c": 1}, np=3, reset_limit=1).start()
    sim.driver.worker_exited("c:0", 1)
    sim.join(sim.ready_async("a:0", "b:0"))
    assert sim.driver.world.round == 2
    sim.driver.worker_exited("b:0", 1)
    sim.join(sim.ready_async("a:0"))
    assert sim.answers["a:0"]["action"] == "abort"
    assert sim.driver.wait() == RESET_LIMIT_MESSAGE % 1


def test_straggler_is_stopped_after_the_timeout():
    sim = Sim({"a": 1, "b": 1}, np=2, timeout=0.5).start()
    threads = sim.ready_async("a:0")   # b:0 hangs and never resets
    waiter = threading.Thread(target=sim.driver.wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while not sim.terminated and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.terminated == ["b:0"]
    sim.driver.worker_exited("b:0", -15)
    sim.join(threads)
    assert sim.answers["a:0"]["action"] == "run" and sim.answers["a:0"]["size"] == 1
    sim.driver.worker_exited("a:0", 0)
    waiter.join(5)
    assert sim.driver.error is None


def test_driver_rejects_bad_sizes():
    with pytest.raises(ValueError, match="min-np"):
        Sim({"a": 1}, np=1, min_np=2)


def test_a_long_poll_of_an_ended_world_returns_when_the_next_forms():
    """Otherwise a survivor would miss host updates for up to one poll (30 s)."""
    sim = Sim({"a": 1, "b": 1}, np=2).start()
    got = {}
    poll = threading.Thread(target=lambda: got.update(
        sim.driver.wait_notification("a:0", 1, 0, 30.0)))
    poll.start()
    time.sleep(0.1)
    sim.driver.worker_exited("b:0", 1)
    sim.join(sim.ready_async("a:0"))
    poll.join(5)
    assert not poll.is_alive() and got["round"] == 2
    # In its new world the worker hears of the next change.
    sim.discovery.set({"a": 1, "c": 1})
    sim.driver.poll_hosts()
    assert sim.driver.wait_notification("a:0", 2, 0, 0.1)["update"] == \
        int(HostUpdateResult.added)
