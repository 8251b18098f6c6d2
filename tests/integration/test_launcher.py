"""tfhvdrun end to end: real mpirun jobs, bad input, check-build, tfhvd.run."""

import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from jobs import ROOT, clean_env, launch, result_line, run, tfhvdrun, train

PY = sys.executable


def py(code: str):
    """A rank command that runs Python code (no TensorFlow: starts fast)."""
    return [PY, "-c", code]


def test_training_job_runs_on_two_ranks():
    job = train(2, "--steps", "3", timeout=120)
    assert job.rc == 0, job.explain()
    res = result_line(job)
    assert res["size"] == 2 and res["ranks_agree"], res
    assert job.out.count("RESULT") == 1  # rank 0 only


def test_every_line_is_tagged_with_its_rank():
    """Also: Horovod's get_env_rank_and_size() reads mpirun's variables."""
    job = launch(["-np", "2"] + py("import os; print('hello from', "
                                   "os.environ['OMPI_COMM_WORLD_RANK']); "
                                   "from tfhvd.runner.common.util import env; "
                                   "print('env says', *env.get_env_rank_and_size())"))
    assert job.rc == 0, job.explain()
    assert "[1,0]<stdout>:hello from 0" in job.out
    assert "[1,1]<stdout>:hello from 1" in job.out
    assert "[1,0]<stdout>:env says 0 2" in job.out and "[1,1]<stdout>:env says 1 2" in job.out


def test_exit_code_is_the_jobs():
    job = launch(["-np", "2"] + py("import sys; sys.exit(3)"))
    assert job.rc == 3, job.explain()
    assert "tfhvdrun: the job failed (exit code 3)" in job.err


def test_flags_reach_the_ranks_as_tfhvd_variables(tmp_path):
    code = ("import os; print(sorted((k, v) for k, v in os.environ.items() "
            "if k.startswith('TFHVD_') and k != 'TFHVD_SOCKET_IFNAME'))")
    job = launch(["-np", "2", "--fusion-threshold-mb", "1", "--cycle-time-ms", "3",
                  "--cache-capacity", "7", "--log-level", "error",
                  "--timeline-filename", str(tmp_path / "t.json"), "--timeline-mark-cycles",
                  "--stall-check-warning-time-seconds", "9",
                  "--stall-check-shutdown-time-seconds", "19", "--no-stall-check"]
                 + py(code))
    assert job.rc == 0, job.explain()
    expected = str(sorted([
        ("TFHVD_CACHE_CAPACITY", "7"), ("TFHVD_CYCLE_TIME", "3"),
        ("TFHVD_FUSION_THRESHOLD", str(1024 * 1024)), ("TFHVD_LOG_LEVEL", "error"),
        ("TFHVD_STALL_CHECK_DISABLE", "1"), ("TFHVD_STALL_CHECK_TIME_SECONDS", "9"),
        ("TFHVD_STALL_SHUTDOWN_TIME_SECONDS", "19"),
        ("TFHVD_TIMELINE", str(tmp_path / "t.json")), ("TFHVD_TIMELINE_MARK_CYCLES", "1")]))
    assert "[1,0]<stdout>:" + expected in job.out, job.explain()
    assert "[1,1]<stdout>:" + expected in job.out, job.explain()


def test_the_runtime_parses_what_the_flags_set():
    code = ("import tfhvd.tensorflow as hvd; s = hvd.settings(); "
            "print('SETTINGS', s['fusion_threshold_bytes'], s['cycle_time_ms'], "
            "s['stall_check_time_s'], s['stall_check_disable'])")
    job = launch(["-np", "1", "--fusion-threshold-mb", "2", "--cycle-time-ms", "4",
                  "--stall-check-warning-time-seconds", "11", "--no-stall-check"] + py(code))
    assert job.rc == 0, job.explain()
    assert "SETTINGS %d 4 11 1" % (2 * 1024 * 1024) in job.out, job.explain()


def test_verbose_prints_the_mpirun_command():
    job = launch(["-np", "1", "--verbose"] + py("pass"))
    assert job.rc == 0, job.explain()
    assert "tfhvdrun: " in job.err and "--bind-to none" in job.err and " -np 1 " in job.err


def test_output_filename_keeps_each_ranks_output(tmp_path):
    job = launch(["-np", "2", "--output-filename", str(tmp_path / "logs")]
                 + py("import os; print('out', os.environ['OMPI_COMM_WORLD_RANK'])"))
    assert job.rc == 0, job.explain()
    for rank in (0, 1):
        # One clean line per print: no tags, not split, only this rank's.
        assert (tmp_path / "logs" / ("rank.%d" % rank) / "stdout").read_text() == \
            "out %d\n" % rank


def test_sigterm_to_the_launcher_ends_the_job():
    marker = "tfhvd-sigterm-" + uuid.uuid4().hex[:8]
    proc = subprocess.Popen(tfhvdrun() + ["-np", "2"] + py(
        "import time, sys; print('started', flush=True); time.sleep(120)  # " + marker),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
            if len(running.stdout.split()) >= 2:  # both ranks started
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert not left.strip(), "ranks still running after SIGTERM: %s" % left


# ---------------------------------------------------------------- bad input


def test_unparseable_host_list():
    job = launch(["-np", "2", "-H", "hostA:2,,hostB", "python", "t.py"], timeout=30)
    assert job.rc == 2 and job.seconds < 10, job.explain()
    assert "-H/--hosts 'hostA:2,,hostB': empty entry" in job.err


def test_np_larger_than_the_slots():
    job = launch(["-np", "5", "-H", "hostA:2,hostB:2", "python", "t.py"], timeout=30)
    assert job.rc == 2 and job.seconds < 10, job.explain()
    assert "-np 5 is larger than the 4 slots of -H hostA:2,hostB:2" in job.err


def test_missing_mpirun_says_how_to_install_it(tmp_path):
    from tfhvd.runner.launch import library_backends

    env = clean_env({"PATH": str(tmp_path)})
    job = run([PY, "-m", "tfhvd.runner", "--mpi", "-np", "1", PY, "-c", "pass"], env=env,
              timeout=30)
    assert job.rc == 127, job.explain()
    assert "mpirun was not found on PATH" in job.err
    assert "apt-get install -y openmpi-bin" in job.err
    # Without --mpi, a library with Gloo runs the job without mpirun (Horovod's default).
    job = run([PY, "-m", "tfhvd.runner", "-np", "1", PY, "-c", "print('ran')"], env=env,
              timeout=30)
    if library_backends()["gloo"]:
        assert job.rc == 0 and "[1,0]<stdout>:ran" in job.out, job.explain()
    else:
        assert job.rc == 127 and "mpirun was not found on PATH" in job.err, job.explain()


def test_missing_script():
    job = launch(["-np", "2", PY, "no/such/train.py"], timeout=30)
    assert job.rc == 2 and job.seconds < 10, job.explain()
    assert "script 'no/such/train.py' does not exist" in job.err


def _can_make_netns() -> str:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = "tfhvd-probe-%d" % os.getpid()
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return "cannot create network namespaces here: " + r.stderr.strip()
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def test_unreachable_host_fails_within_start_timeout():
    why = _can_make_netns()
    if why:
        pytest.skip(why)
    if shutil.which("ssh") is None:
        pytest.skip("needs an ssh client")
    # In a namespace of its own, 198.18.99.2 sits behind a veth pair whose
    # other end is this namespace too, and its neighbour entry names a MAC
    # nobody has: every packet is dropped silently, so ssh would wait
    # forever, and no packet leaves the namespace.
    ns = "tfhvd-unreach-%d" % os.getpid()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                    ["ip", "addr", "add", "198.18.99.1/24", "dev", "v0"],
                    ["ip", "link", "set", "v0", "up"], ["ip", "link", "set", "v1", "up"],
                    ["ip", "link", "set", "lo", "up"],
                    ["ip", "neigh", "add", "198.18.99.2", "lladdr", "02:00:00:00:00:99",
                     "dev", "v0", "nud", "permanent"]):
            subprocess.run(["ip", "netns", "exec", ns] + cmd, check=True)
        job = run(tfhvdrun() + ["-np", "2", "-H", "localhost:1,198.18.99.2:1",
                                "--start-timeout", "3"] + py("pass"),
                  prefix=["ip", "netns", "exec", ns], timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    assert job.rc == 3, job.explain()
    assert job.seconds < 3 + 10, job.explain()
    assert "not reachable over ssh within --start-timeout 3 s" in job.err
    assert "198.18.99.2" in job.err


# ---------------------------------------------------------------- check-build


def test_check_build_is_truthful():
    """The report against ground truth: what the library file it names links
    and holds (readelf, nm -D), not the calls that produce the report."""
    from tests.conftest import library_ground_truth

    job = run([PY, "-m", "tfhvd.runner", "--check-build"], timeout=120)
    assert job.rc == 0, job.explain()
    text = job.out
    lib = [x for x in text.splitlines() if x.startswith("Library: ")]
    assert lib, text
    path = lib[0][len("Library: "):].strip()
    assert os.path.isfile(path), path
    truth = library_ground_truth(path)
    assert truth["mpi"], truth  # this build uses MPI for CPU collectives
    mpi, nccl, cuda, gloo = truth["mpi"], truth["nccl"], truth["cuda"], truth["gloo"]
    mark = {True: "[X]", False: "[ ]"}
    assert "tfhvd v" in text
    assert "[X] TensorFlow" in text
    assert "[ ] PyTorch" in text and "[ ] MXNet" in text
    controllers = text.split("Available Controllers:")[1].split("\n\n")[0]
    assert "%s MPI" % mark[mpi] in controllers and "%s Gloo" % mark[gloo] in controllers
    ops = text.split("Available Tensor Operations:")[1].split("\n\n")[0]
    assert "%s NCCL" % mark[nccl] in ops and "%s MPI" % mark[mpi] in ops
    assert "%s Gloo" % mark[gloo] in ops
    assert "%s built with CUDA" % mark[cuda] in text
    driver = os.path.exists("/dev/nvidiactl") or ctypes.util.find_library("cuda") is not None
    gpus = len([p for p in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", p)])
    assert "%s CUDA driver present on this machine (%d GPU device" % (mark[driver], gpus) in text
    assert ("[X] Keras 3" in text) == os.path.isdir(os.path.join(ROOT, "tfhvd", "keras"))


def test_help_and_version():
    job = run([PY, "-m", "tfhvd.runner", "--help"], timeout=30)
    assert job.rc == 0
    for flag in ("-np", "--hostfile", "--start-timeout", "--output-filename", "--mpi-args",
                 "--ssh-port", "--ssh-identity-file", "--network-interface", "--check-build",
                 "--verbose", "--log-level", "--fusion-threshold-mb", "--cycle-time-ms",
                 "--cache-capacity", "--timeline-filename", "--timeline-mark-cycles",
                 "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
                 "--no-stall-check"):
        assert flag in job.out, flag
    job = run([PY, "-m", "tfhvd.runner", "--version"], timeout=30)
    assert job.rc == 0 and job.out.startswith("tfhvd ")


# ---------------------------------------------------------------- tfhvd.run


def where_am_i(offset):
    import os

    return int(os.environ["OMPI_COMM_WORLD_RANK"]) + offset


def allreduce_rank(scale):
    import tfhvd.tensorflow as hvd

    hvd.init()
    total = hvd.allreduce(float(hvd.rank() + 1) * scale, op=hvd.Sum).numpy()
    return hvd.rank(), hvd.size(), float(total)


def fail_on_rank_one():
    import os

    if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
        raise ValueError("rank one says no")
    return "fine"


def test_run_returns_each_ranks_result():
    from tfhvd.runner import run as tfhvd_run

    assert tfhvd_run(where_am_i, args=(10,), np=3, env=clean_env()) == [10, 11, 12]
    # A lambda travels by value (cloudpickle).
    assert tfhvd_run(lambda a, b=0: a * b, args=(6,), kwargs={"b": 7}, np=2,
                     env=clean_env()) == [42, 42]


def test_run_with_collectives():
    from tfhvd.runner import run as tfhvd_run

    results = tfhvd_run(allreduce_rank, args=(2.0,), np=2, env=clean_env(), timeout=120)
    assert results == [(0, 2, 6.0), (1, 2, 6.0)]


def test_run_raises_with_the_failing_rank():
    from tfhvd.runner import RunError, run as tfhvd_run

    with pytest.raises(RunError, match="rank 1 raised ValueError: rank one says no") as e:
        tfhvd_run(fail_on_rank_one, np=2, env=clean_env(), timeout=60)
    assert e.value.rank == 1
    assert "rank one says no" in e.value.remote_traceback


def test_run_rejects_bad_arguments():
    from tfhvd.runner import run as tfhvd_run

    with pytest.raises(ValueError, match="larger than the 1 slot"):
        tfhvd_run(where_am_i, args=(0,), np=2, hosts="localhost:1")
    with pytest.raises(TypeError, match="unexpected keyword argument min_nproc"):
        tfhvd_run(where_am_i, np=1, min_nproc=1)  # elastic keywords are checked
    with pytest.raises(ValueError, match="not both"):
        tfhvd_run(where_am_i, np=1, use_gloo=True, use_mpi=True)
