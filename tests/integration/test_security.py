"""Running jobs against an outsider (probe.py): a 2-rank ``tfhvdrun --gloo``
job, an elastic job and a Spark ``run_elastic`` job (Spark in local mode).

The probe knows nothing of the job: it finds the launcher's listening ports
in /proc and sends unsigned and forged requests, random bytes, a body
announced as 10 GB, a client sending a byte a second, and 400 connections
at once, while the ranks rendezvous and train.  Each test checks that every
attempt was refused, that the job finished with the right result, and that
the refusals were logged once (then counted), not per attempt.
"""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import engine_jobs
import probe
from jobs import clean_env, tfhvdrun

# The job outlives the probe, however slow the machine: each rank waits
# (at most 120 s) for the test to say the probe is done, so every attempt,
# the flood last, meets a running server.
HOLD = textwrap.dedent("""
    import os, time
    def _hold_until_probed():
        deadline = time.monotonic() + 120
        while not os.path.exists("probe_done") and time.monotonic() < deadline:
            time.sleep(0.2)
""")

PROGRAM = HOLD + textwrap.dedent("""
    import os, sys, time
    import tensorflow as tf
    import tfhvd.tensorflow as hvd
    hvd.init()
    assert os.environ["TFHVD_SECRET_KEY"] not in " ".join(sys.argv)
    total = 0.0
    for step in range(40):
        total += float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum))
        time.sleep(0.2)
    print("RESULT rank %d total %.1f" % (hvd.rank(), total), flush=True)
    _hold_until_probed()
""")

ELASTIC_PROGRAM = HOLD + textwrap.dedent("""
    import time
    import tensorflow as tf
    import tfhvd.tensorflow as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(batch=0, total=0.0)

    @hvd.elastic.run
    def train(state):
        while state.batch < 40:
            state.total += float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum))
            state.batch += 1
            state.commit()
            time.sleep(0.2)
        return state.total

    print("RESULT rank %d total %.1f" % (hvd.rank(), train(state)), flush=True)
    _hold_until_probed()
""")


def _check_refused(seen):
    """Every stranger's attempt was refused; the slow client was cut off."""
    for key in ("unsigned_put", "unsigned_get", "unsigned_post", "forged_put", "huge_claim"):
        assert seen[key] == 403, (key, seen)
    assert seen["random_bytes"] in (400, None), seen
    assert seen["huge_claim_s"] < 5, seen        # refused before the 10 GB were read
    assert seen["slow_s"] < 9, seen              # the 5 s head timeout, not 12 s
    assert seen["flood"] > 0, seen
    assert seen["after_flood"] == 403, seen


def _run_probed(cmd, n_ports, tmp_path, env=None):
    proc = subprocess.Popen(cmd, env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        ports = probe.wait_for_ports(proc.pid, n_ports)
        seen = {port: probe.probe_http("127.0.0.1", port) for port in ports}
        (tmp_path / "probe_done").write_text("")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err, ports, seen


def test_a_gloo_job_refuses_an_outsider_and_finishes(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    rc, out, err, ports, seen = _run_probed(
        tfhvdrun() + ["--gloo", "-np", "2", sys.executable, str(prog)], 1, tmp_path)
    assert rc == 0, out + err
    # A one-host job listens on loopback only.
    assert set(ports.values()) == {"127.0.0.1"}, ports
    for port_seen in seen.values():
        _check_refused(port_seen)
    # 40 steps of 1 + 2 on every rank.
    assert out.count("total 120.0") == 2, out + err
    assert err.count("the rendezvous server refused a request") == 1, err
    assert "the rendezvous server refused" in err and "requests in all" in err, err


def test_an_elastic_job_refuses_an_outsider_and_finishes(tmp_path):
    prog = tmp_path / "prog.py"
    prog.write_text(ELASTIC_PROGRAM)
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho 127.0.0.1:2\n")
    discover.chmod(0o755)
    rc, out, err, ports, seen = _run_probed(
        tfhvdrun() + ["-np", "2", "--min-np", "2", "--host-discovery-script", str(discover),
                      sys.executable, str(prog)], 2, tmp_path)
    assert rc == 0, out + err
    assert set(ports.values()) == {"127.0.0.1"}, ports
    for port_seen in seen.values():
        _check_refused(port_seen)
    assert out.count("total 80.0") == 2, out + err
    assert err.count("the rendezvous server refused a request") == 1, err
    assert err.count("the elastic driver's service refused a request") == 1, err


def test_a_rank_with_another_secret_cannot_join(tmp_path):
    """A rank that was not given the job's secret fails at the rendezvous
    with a message that says so (and the job with it)."""
    prog = tmp_path / "prog.py"
    prog.write_text("import os\nif os.environ['HOROVOD_RANK'] == '1':\n"
                    "    os.environ['TFHVD_SECRET_KEY'] = 'not the job secret'\n"
                    "import tfhvd.tensorflow as hvd\nhvd.init()\n")
    proc = subprocess.run(tfhvdrun() + ["--gloo", "-np", "2", sys.executable, str(prog)],
                          env=clean_env({"HOROVOD_GLOO_TIMEOUT_SECONDS": "10"}),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "refused this rank's signature" in proc.stdout + proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("name", ["TFHVD_SECRET_KEY", "HOROVOD_SECRET_KEY"])
def test_the_users_secret_is_the_jobs(tmp_path, name):
    prog = tmp_path / "prog.py"
    prog.write_text("import os\nprint('KEY', os.environ['TFHVD_SECRET_KEY'])\n"
                    "import tfhvd.tensorflow as hvd\nhvd.init()\nprint('size', hvd.size())\n")
    proc = subprocess.run(tfhvdrun() + ["--gloo", "-np", "2", sys.executable, str(prog)],
                          env=clean_env({name: "users-own-secret"}), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("KEY users-own-secret") == 2, proc.stdout
    assert proc.stdout.count("size 2") == 2, proc.stdout


def test_os_environ_of_a_rank_is_not_its_command_line(tmp_path):
    """``ps`` shows no secret: the ranks' and the launcher's command lines."""
    prog = tmp_path / "prog.py"
    prog.write_text("import os, time\nprint('KEY', os.environ['TFHVD_SECRET_KEY'], flush=True)\n"
                    "time.sleep(3)\n")
    proc = subprocess.Popen(tfhvdrun() + ["--gloo", "-np", "2", sys.executable, str(prog)],
                            env=clean_env(), stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    key = line.split("KEY ", 1)[1].strip()
    time.sleep(0.5)
    cmdlines = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmdlines.append(f.read())
            except OSError:
                pass
    proc.communicate(timeout=60)
    assert len(key) == 64
    assert not any(key.encode() in c for c in cmdlines)


def test_a_spark_run_elastic_job_refuses_an_outsider_and_finishes(tmp_path, capfd):
    """The driver's rendezvous store (the agents' channel: registrations,
    heartbeats, commands, reports) and elastic service, probed while the
    agents register and the workers train."""
    pytest.importorskip("pyspark", reason="tfhvd.spark needs the [spark] extra")
    from pyspark.sql import SparkSession

    import tfhvd.spark

    engine_jobs.by_value(engine_jobs)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
        .config("spark.python.worker.reuse", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    box = {}
    before = set(probe.listening_ports(os.getpid()))

    def outsider():
        box["ports"] = probe.wait_for_ports(os.getpid(), 2, exclude=before)
        box["seen"] = {p: probe.probe_http("127.0.0.1", p) for p in box["ports"]}
        (tmp_path / "probe_done").write_text("")

    thread = threading.Thread(target=outsider, daemon=True)
    thread.start()
    try:
        results = tfhvd.spark.run_elastic(engine_jobs.elastic_training,
                                          args=(str(tmp_path), 60, str(tmp_path / "probe_done")),
                                          num_proc=2, min_np=2,
                                          max_np=2, start_timeout=120, elastic_timeout=120)
        thread.join(timeout=60)
    finally:
        session.stop()
    err = capfd.readouterr().err
    assert [(r["batch"], r["weight"], r["size"]) for r in results] == [(60, 60.0, 2)] * 2
    assert set(box["ports"].values()) == {"127.0.0.1"}, box
    assert len(box["seen"]) == 2, box
    for port_seen in box["seen"].values():
        _check_refused(port_seen)
    assert err.count("the rendezvous server refused a request") == 1, err
    assert err.count("the elastic driver's service refused a request") == 1, err
