"""RayHostDiscovery on a Ray cluster of two nodes on this machine: a head
started with ``ray start --head`` and a second node joined to it with its own
node address (127.0.0.2), as a multi-node cluster looks to the discovery."""

import ast
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import engine_jobs as jobs

pytest.importorskip("ray", reason="Ray is not installed (the [ray] extra)")

PROBE = r"""
import sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.time() + 60
while time.time() < deadline and sum(1 for n in ray.nodes() if n.get("Alive")) < 2:
    time.sleep(0.5)
from tfhvd.ray import RayHostDiscovery
print("HOSTS", sorted(RayHostDiscovery(cpus_per_slot=1).find_available_hosts_and_slots().items()))
ray.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_discovery_finds_the_head_and_the_joined_node():
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="tfhvd-ray", dir="/tmp")  # Ray's socket paths are short
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    address = "127.0.0.1:%d" % port
    try:
        subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1",
                        "--port=%d" % port, "--num-cpus=1", "--include-dashboard=false",
                        "--disable-usage-stats", "--temp-dir=%s" % temp],
                       env=env, check=True, capture_output=True, timeout=180)
        subprocess.run([ray_cli, "start", "--address=%s" % address,
                        "--node-ip-address=127.0.0.2", "--num-cpus=2", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=180)
        r = subprocess.run([sys.executable, "-c", PROBE, address], env=env, capture_output=True,
                           text=True, timeout=180)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("HOSTS ")), None)
        assert line is not None, (r.stdout + r.stderr)[-3000:]
        hosts = dict(ast.literal_eval(line[len("HOSTS "):]))
        assert len(hosts) == 2, hosts
        assert hosts.get("127.0.0.2") == 2, hosts
        assert sum(hosts.values()) == 3, hosts
    finally:
        procs = set(jobs.pids_matching(temp)) | set(jobs.pids_matching(":%d " % port))
        for pid in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert jobs.wait_gone(list(procs)) == [], "the Ray nodes outlived the test"
        time.sleep(0.5)
        subprocess.run(["rm", "-rf", temp], check=False)
