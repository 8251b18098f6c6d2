"""RayHostDiscovery over mocked ``ray.nodes()`` records: Horovod's tests mock
them with ``alive`` only, Ray itself gives ``Alive`` (and both, lately)."""

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (the [ray] extra)")

from tfhvd.ray import RayHostDiscovery  # noqa: E402
from tfhvd.ray.elastic import node_alive  # noqa: E402


def nodes(key, alive=(True, True, True)):
    return [{"NodeManagerAddress": "host-%d" % (i + 1), "Resources": {"GPU": 2, "CPU": 8},
             key: a} for i, a in enumerate(alive)]


@pytest.mark.parametrize("key", ["alive", "Alive"])
def test_every_live_node_is_a_host(monkeypatch, key):
    monkeypatch.setattr(ray, "nodes", lambda: nodes(key))
    assert RayHostDiscovery(cpus_per_slot=1).find_available_hosts_and_slots() == \
        {"host-1": 8, "host-2": 8, "host-3": 8}
    assert RayHostDiscovery(use_gpu=True, cpus_per_slot=1).find_available_hosts_and_slots() == \
        {"host-1": 2, "host-2": 2, "host-3": 2}
    assert RayHostDiscovery(use_gpu=True, cpus_per_worker=1, gpus_per_worker=2) \
        .find_available_hosts_and_slots() == {"host-1": 1, "host-2": 1, "host-3": 1}


def test_dead_nodes_are_left_out(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: nodes("alive", (True, False, True)))
    assert sorted(RayHostDiscovery().find_available_hosts_and_slots()) == ["host-1", "host-3"]


def test_node_alive_reads_either_key_and_the_state():
    assert node_alive({"Alive": True, "alive": True})
    assert not node_alive({"Alive": False})
    assert node_alive({"alive": True}) and not node_alive({"alive": False})
    assert node_alive({"State": "ALIVE"}) and not node_alive({"State": "DEAD"})
    assert not node_alive({})
