"""tfhvd.runner.engines.own_session: an engine's worker (a Ray actor, a Spark
task's Python worker) moves into a session of its own, as tfhvdrun's ranks
have, from each of the process-group positions the engines put it in."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

_REPORT = "print(ok, os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid(), flush=True)"


def _child(body: str, env_extra=None, **popen) -> str:
    code = "import os\nfrom tfhvd.runner.engines import own_session\n" + textwrap.dedent(body)
    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, **popen)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_member_of_its_parents_group_gets_its_own_session():
    """Spark's case: a child in its parent's process group and session."""
    assert _child("ok = own_session()\n" + _REPORT) == ["True", "True", "True"]


def test_a_group_leader_gets_its_own_session_and_group():
    """Ray's case: the worker leads its own group, where setsid alone fails."""
    assert _child("assert os.getpgid(0) == os.getpid()\nok = own_session()\n" + _REPORT,
                  preexec_fn=os.setpgrp) == ["True", "True", "True"]


def test_a_session_leader_stays_as_it_is():
    assert _child("ok = own_session()\n" + _REPORT, start_new_session=True) == \
        ["True", "True", "True"]


def test_inherit_keeps_the_engines_session():
    assert _child("ok = own_session()\n" + _REPORT, {"TFHVD_ENGINE_SESSION": "inherit"},
                  preexec_fn=os.setpgrp) == ["False", "False", "True"]


def test_a_bad_setting_is_named():
    out = _child("""
        try:
            own_session()
        except ValueError as e:
            print("error", "TFHVD_ENGINE_SESSION='shared'" in str(e))
        """, {"TFHVD_ENGINE_SESSION": "shared"})
    assert out == ["error", "True"]


def test_a_leader_whose_group_has_other_members_keeps_its_group():
    """setsid fails while another process is in the leader's group: the
    worker goes back to the group it led and reports False."""
    body = """
        import subprocess, sys
        member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert os.getpgid(member.pid) == os.getpid()
            ok = own_session()
        finally:
            member.kill()
        """ + _REPORT
    assert _child(body, preexec_fn=os.setpgrp) == ["False", "False", "True"]


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie its new parent has yet to reap."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_leaving_the_group_its_parent_leads_keeps_the_parents_end_signal(tmp_path):
    """PySpark's daemon leads its workers' group and ends them with a SIGHUP to
    it; a worker that left the group gets SIGHUP when the daemon dies."""
    pid_file = tmp_path / "worker.pid"
    worker_code = ("import os, sys, time\n"
                   "from tfhvd.runner.engines import own_session\n"
                   "assert own_session()\n"
                   "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                   "time.sleep(60)\n")
    daemon = textwrap.dedent("""
        import os, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
        while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
            time.sleep(0.05)
        """)
    subprocess.run([sys.executable, "-c", daemon, str(pid_file), worker_code], check=True, timeout=60,
                   preexec_fn=os.setpgrp)  # leads its group, as PySpark's daemon does
    worker = int(pid_file.read_text())
    end = time.time() + 10
    while time.time() < end:
        if not _alive(worker):
            return
        time.sleep(0.05)
    os.kill(worker, signal.SIGKILL)
    pytest.fail("the worker outlived the parent whose group it left")


def test_a_multithreaded_parent_arms_no_death_signal(tmp_path):
    """A parent with more threads than one (a JVM) could end the worker when
    the thread that started it exits: no death signal is armed there."""
    pid_file = tmp_path / "worker.pid"
    worker_code = ("import os, sys, time\n"
                   "from tfhvd.runner.engines import own_session\n"
                   "assert own_session()\n"
                   "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                   "time.sleep(5)\n")
    parent = textwrap.dedent("""
        import os, subprocess, sys, threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        worker = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
        while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
            time.sleep(0.05)
        """)
    subprocess.run([sys.executable, "-c", parent, str(pid_file), worker_code], check=True,
                   timeout=60, preexec_fn=os.setpgrp)
    worker = int(pid_file.read_text())
    time.sleep(1)
    alive = _alive(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert alive, "the worker was ended with its multithreaded parent"
