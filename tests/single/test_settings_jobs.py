"""Runtime settings, end to end: each changes something a job can observe.

Whole ``mpirun -np 2`` jobs started from one pytest process, as in
``test_mpirun_jobs.py``.  The witnesses: the timeline (when rounds happen, what
was fused), the bytes on a private loopback interface (what negotiation sends),
and rank 0's log line naming the control channel really in use.

Some jobs put rank 1 in its own UTS namespace with another host name, so that
it reaches the coordinator over TCP (not the same-host Unix socket), and the
job in its own network namespace, so that the loopback's byte counters count
this job alone.  Both need root.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from typing import Dict, List, Optional

import pytest

from tests.conftest import ROOT, job_env

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")

_PRELUDE = textwrap.dedent("""
    import json, os, time
    import numpy as np
    import tensorflow as tf
    import tfhvd.tensorflow as hvd
    def say(*a):
        os.write(1, (' '.join(map(str, a)) + '\\n').encode())
    def lo_bytes():
        with open('/sys/class/net/lo/statistics/tx_bytes') as f:
            return int(f.read())
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
""")


def _needs_root() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root for network and UTS namespaces"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return "needs %s" % tool
    return None


def job(code: str, env: Dict[str, str], other_host: bool = False, netns: Optional[str] = None,
        timeout: float = 240) -> str:
    """Runs the prelude plus ``code`` on 2 ranks; returns the merged output (asserts exit 0).

    ``other_host``: rank 1 runs under another host name.  ``netns``: the whole
    job runs in that network namespace.
    """
    cmd: List[str] = ["ip", "netns", "exec", netns] if netns else []
    cmd += [MPIRUN, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in env:
        cmd += ["-x", key]
    program = [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)]
    if other_host:
        rename = ["unshare", "--uts", "sh", "-c", 'hostname elsewhere && exec "$0" "$@"']
        program = ["bash", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@"; '
                   'else shift 5; exec "$@"; fi', "rank1"] + rename + program
    cmd += ["-np", "2"] + program
    out = subprocess.run(cmd, env=job_env(env), cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    return text


def results(text: str) -> Dict[int, dict]:
    """The ``RESULT <rank> {json}`` lines, by rank."""
    found = {}
    for line in text.splitlines():
        if line.startswith("RESULT "):
            _, r, payload = line.split(" ", 2)
            found[int(r)] = json.loads(payload)
    assert sorted(found) == [0, 1], text[-4000:]
    return found


@pytest.fixture
def netns():
    """A fresh network namespace with only a loopback interface."""
    why = _needs_root()
    if why:
        pytest.skip(why)
    name = "tfhvd-settings-%d" % os.getpid()
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot create a network namespace here: %s" % r.stderr.strip())
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


_TIMELINE_JOB = """
    path = os.environ["PROBE_DIR"] + "/tl.{rank}.json"
    hvd.start_timeline(path, mark_cycles=False)
    x = tf.ones([257])
    for i in range(6):
        hvd.allreduce(x, op=hvd.Sum, name="seq_%d" % i)
    @tf.function
    def many():
        return [hvd.allreduce(x * (i + 1.0), op=hvd.Sum, name="many_%d" % i) for i in range(8)]
    outs = many()
    hvd.stop_timeline()
    ok = all(float(o[0]) == 2.0 * (i + 1) for i, o in enumerate(outs))
    evs = json.load(open(path.replace("{rank}", str(rank))))
    rows = {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}
    starts = {}
    for e in evs:
        if e.get("ph") == "B" and e.get("name") in ("allreduce", "MEMCPY_IN_FUSION_BUFFER"):
            starts.setdefault(e["name"], []).append((rows[e["tid"]], e["ts"]))
    say("RESULT", rank, json.dumps({"ok": ok, "starts": starts}))
"""


def _timeline_job(tmp_path, env: Dict[str, str]) -> dict:
    env = dict(env, PROBE_DIR=str(tmp_path))
    return results(job(_TIMELINE_JOB, env))[0]


def _seq_gaps_ms(result: dict) -> List[float]:
    seq = sorted(ts for name, ts in result["starts"]["allreduce"] if name.startswith("seq_"))
    return [(b - a) / 1000.0 for a, b in zip(seq, seq[1:])]


def test_cycle_time_and_fusion_threshold(tmp_path):
    """Two jobs, each a control for the other.

    CYCLE_TIME=150: rank 0 computes a round at most every 150 ms, so one eager
    allreduce after another starts 150 ms after the last (with 0 they follow at
    once), and the tf.function's 8 allreduces wait for the same round and are
    fused under the default FUSION_THRESHOLD.  FUSION_THRESHOLD=1000, below one
    tensor's 1028 bytes (257 float32): nothing is fused.
    """
    spaced = _timeline_job(tmp_path, {"TFHVD_CYCLE_TIME": "150"})
    free = _timeline_job(tmp_path, {"HOROVOD_CYCLE_TIME": "0",
                                    "HOROVOD_FUSION_THRESHOLD": "1000"})
    assert spaced["ok"] and free["ok"]
    gaps = _seq_gaps_ms(spaced)
    assert len(gaps) == 5 and min(gaps) >= 140, gaps
    free_gaps = _seq_gaps_ms(free)
    assert sorted(free_gaps)[len(free_gaps) // 2] < 100, free_gaps
    many = {"many_%d" % i for i in range(8)}
    fused = {n for n, _ in spaced["starts"].get("MEMCPY_IN_FUSION_BUFFER", [])} & many
    assert len(fused) >= 4, spaced["starts"]
    assert free["starts"].get("MEMCPY_IN_FUSION_BUFFER", []) == [], free["starts"]
    assert len([n for n, _ in free["starts"]["allreduce"] if n in many]) == 8


_CACHE_JOB = """
    name = "cache_probe_" + "x" * 150
    x = tf.ones([4])
    for i in range(5):
        hvd.allreduce(x, name=name)
    before = lo_bytes()
    for i in range(200):
        hvd.allreduce(x, name=name)
    sent = lo_bytes() - before
    ok = float(hvd.allreduce(x, op=hvd.Sum, name=name)[0]) == 2.0
    say("RESULT", rank, json.dumps({"sent": sent, "ok": ok, "host": os.uname()[1]}))
"""


def test_cache_capacity_zero_sends_every_request_in_full(netns):
    """With the response cache, a repeated request travels as a 4-byte id; with
    CACHE_CAPACITY=0 every request carries the tensor's 162-character name.
    Rank 1 (another host name) talks to rank 0 over TCP on the namespace's
    loopback, whose byte counter counts only this job.  The same jobs check
    HOROVOD_SOCKET_IFNAME: rank 0 advertises the loopback only because of it
    (without it a loopback address is never advertised)."""
    env = {"HOROVOD_SOCKET_IFNAME": "lo", "TFHVD_LOG_LEVEL": "info"}
    cached_text = job(_CACHE_JOB, env, other_host=True, netns=netns)
    full_text = job(_CACHE_JOB, dict(env, TFHVD_CACHE_CAPACITY="0"), other_host=True,
                    netns=netns)
    for text in (cached_text, full_text):
        assert "control channel: sockets to 1 peer, 0 of them through shared memory" in text, \
            text[-3000:]
        assert "negotiating over MPI instead" not in text
    cached, full = results(cached_text), results(full_text)
    assert cached[1]["host"] == "elsewhere" and cached[0]["host"] != "elsewhere"
    assert all(r["ok"] for r in (cached[0], cached[1], full[0], full[1]))
    extra = full[1]["sent"] - cached[1]["sent"]
    assert extra >= 200 * 150, (cached[1]["sent"], full[1]["sent"])


_FALLBACK_JOB = """
    vals = [float(hvd.allreduce(tf.fill([3], float(rank + i)), op=hvd.Sum, name="fb_%d" % i)[0])
            for i in range(10)]
    try:
        hvd.allreduce(tf.ones([rank + 1]), name="fb_bad")
        mismatch = "no error"
    except tf.errors.OpError as e:
        mismatch = e.message
    ok = vals == [1.0 + 2 * i for i in range(10)]
    say("RESULT", rank, json.dumps({"ok": ok, "mismatch": mismatch}))
"""


def test_control_falls_back_to_mpi_when_sockets_cannot_connect():
    """Rank 1 is on 'another host' and rank 0 advertises the addresses of an
    interface that does not exist (HOROVOD_SOCKET_IFNAME): the workers cannot
    connect, rank 0 warns, and the job negotiates over MPI, errors included."""
    why = _needs_root()
    if why:
        pytest.skip(why)
    text = job(_FALLBACK_JOB, {"HOROVOD_SOCKET_IFNAME": "tfhvd-none0",
                               "TFHVD_LOG_LEVEL": "info"}, other_host=True)
    assert "negotiating over MPI instead" in text, text[-3000:]
    assert "could not connect every worker to the coordinator" in text
    assert "control channel: MPI messages" in text, text[-3000:]
    found = results(text)
    for r in (0, 1):
        assert found[r]["ok"], found
        assert "fb_bad" in found[r]["mismatch"] and "rank 1 sent shape [2]" in \
            found[r]["mismatch"], found[r]


_YIELD_PROBE = """
import ctypes
import tfhvd.tensorflow as hvd
hvd.init()
pal = ctypes.CDLL("libopen-pal.so.40")
print("YIELD", int(ctypes.c_bool.in_dll(pal, "opal_progress_yield_when_idle").value))
"""


@pytest.mark.parametrize("env,expected", [
    ({}, 1),                                           # the default: tfhvd asks for it
    ({"TFHVD_MPI_YIELD_WHEN_IDLE": "0"}, 0),           # switched off: Open MPI's default
    ({"HOROVOD_MPI_YIELD_WHEN_IDLE": "0"}, 0),         # Horovod's spelling of the setting
    ({"OMPI_MCA_mpi_yield_when_idle": "0"}, 0),        # the user's own MCA value wins
])
def test_mpi_yield_when_idle(env, expected):
    """MPI_YIELD_WHEN_IDLE: when tfhvd initialises MPI, Open MPI's progress
    loop yields the core while it waits (docs/PERFORMANCE.md: a Keras step's
    allreduce otherwise spins away the core its late peer needs).  Read back
    from Open MPI itself, in a singleton (never oversubscribed, which would
    turn yielding on by itself)."""
    try:
        import ctypes
        ctypes.CDLL("libopen-pal.so.40")
    except OSError:
        pytest.skip("not Open MPI 4 (libopen-pal.so.40): the setting only concerns Open MPI")
    out = subprocess.run([sys.executable, "-c", _YIELD_PROBE], env=job_env(env), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "YIELD %d" % expected in out.stdout, out.stdout[-2000:]
