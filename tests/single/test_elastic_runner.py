"""The elastic launcher without TensorFlow: flags, and real jobs of tiny
workers that talk to the driver through the worker channel directly
(``tests/single/elastic_fake_worker.py``), so the process layer (spawning,
exit codes, resets over HTTP, leaving, the elastic timeout) is checked in
seconds.  The training side is tests/integration/test_elastic.py.
"""

import io
import json
import os
import sys
import time

import pytest

from tfhvd.runner.args import UsageError, parse_args
from tfhvd.runner.elastic.api import elastic_argv
from tfhvd.runner.elastic.launch import ElasticJob

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "elastic_fake_worker.py")


def test_elastic_flags_parse_with_horovods_names():
    a = parse_args(["-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script",
                    "./hosts.sh", "--slots-per-host", "2", "--reset-limit", "3",
                    "--blacklist-cooldown-range", "5", "30", "--elastic-timeout", "9",
                    "python", "train.py"])
    assert (a.num_proc, a.min_num_proc, a.max_num_proc, a.slots) == (2, 1, 4, 2)
    assert (a.reset_limit, a.cooldown_range, a.elastic_timeout) == (3, (5, 30), 9)
    b = parse_args(["--min-np", "2", "--host-discovery-script", "x", "python", "t.py"])
    assert (b.num_proc, b.min_num_proc) == (2, 2)


@pytest.mark.parametrize("argv,message", [
    (["-np", "1", "--min-np", "2", "--host-discovery-script", "x"], "larger than -np"),
    (["-np", "3", "--max-np", "2", "--host-discovery-script", "x"], "smaller than -np"),
    (["-np", "2", "-H", "a:2", "--host-discovery-script", "x"], "not both"),
    (["-np", "2", "--host-discovery-script", "x", "--blacklist-cooldown-range", "0", "5"],
     "cooldown"),
])
def test_bad_elastic_command_lines_say_what_to_change(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv + ["python", "t.py"])


def test_run_keywords_become_flags():
    argv = elastic_argv(2, None, {"min_np": 1, "max_np": 3, "host_discovery_script": "h.sh",
                                  "cooldown_range": (1, 9), "reset_limit": None}, ["cmd"])
    assert argv == ["-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script",
                    "h.sh", "--blacklist-cooldown-range", "1", "9", "--", "cmd"]
    with pytest.raises(TypeError, match="min_nproc"):
        elastic_argv(1, None, {"min_nproc": 1}, ["cmd"])


def run_job(tmp_path, hosts, np, behaviour, *flags):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("\n".join(hosts) + "\n")
    logdir = tmp_path / "log"
    logdir.mkdir(exist_ok=True)
    argv = ["-np", str(np), "--host-discovery-script", "cat %s" % hostfile, *flags,
            sys.executable, FAKE, str(logdir), json.dumps(behaviour)]
    out, err = io.StringIO(), io.StringIO()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    job = ElasticJob(parse_args(argv), env, stdout=out, stderr=err)
    code = job.run(timeout=60)
    records = []
    for name in sorted(os.listdir(logdir)):
        with open(logdir / name) as f:
            records += [json.loads(line) for line in f]
    return code, out.getvalue(), err.getvalue(), records, job


def test_job_of_successful_workers_succeeds(tmp_path):
    code, out, err, recs, job = run_job(tmp_path, ["localhost:2"], 2, {})
    assert code == 0, err
    assert sorted(r["rank"] for r in recs if r["ev"] == "start") == [0, 1]
    assert job.driver.sizes == [2]


def test_killed_worker_survivor_gets_a_new_world_and_rank_zero(tmp_path):
    # Rank 0 (127.0.0.1:0) is SIGKILLed; the survivor asks for the next world.
    behaviour = {"127.0.0.1:0": "kill", "*": "reset_then_exit"}
    code, out, err, recs, job = run_job(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"], 2, behaviour,
                                        "--min-np", "1")
    assert code == 0, err
    worlds = [r for r in recs if r["ev"] == "world"]
    assert [(w["worker"], w["rank"], w["size"], w["round"]) for w in worlds] == \
        [("127.0.0.2:0", 0, 1, 2)]
    assert job.driver.sizes == [2, 1]
    assert "blacklisting host 127.0.0.1" in err


def test_every_worker_failing_fails_the_job(tmp_path):
    code, out, err, recs, job = run_job(tmp_path, ["localhost:2"], 2, {"*": "fail"})
    assert code == 1
    assert "every worker of the last round failed" in err


def test_too_few_slots_after_a_failure_ends_with_the_timeout_error(tmp_path):
    behaviour = {"127.0.0.1:0": "kill", "*": "reset_then_exit"}
    code, out, err, recs, job = run_job(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"], 2, behaviour,
                                        "--min-np", "2", "--elastic-timeout", "2")
    assert code == 1
    assert "timed out after 2 s (--elastic-timeout) waiting for at least --min-np 2" in err
    aborts = [r for r in recs if r["ev"] == "abort"]
    assert aborts and "timed out" in aborts[0]["message"]


def test_worker_of_a_removed_host_leaves(tmp_path):
    hostfile = tmp_path / "hosts"
    # Both start; the first worker removes host 127.0.0.2 from discovery and
    # waits for the notification, then both reset: the removed one leaves.
    behaviour = {"127.0.0.1:0": "remove_other_then_reset", "*": "wait_note_then_reset"}
    code, out, err, recs, job = run_job(tmp_path, ["127.0.0.1:1", "127.0.0.2:1"], 2,
                                        dict(behaviour, hostfile=str(hostfile)), "--min-np", "1")
    assert code == 0, err
    assert [r["worker"] for r in recs if r["ev"] == "leave"] == ["127.0.0.2:0"]
    assert [(r["worker"], r["size"]) for r in recs if r["ev"] == "world"] == \
        [("127.0.0.1:0", 1)]


def _rank_and_world():
    return int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])


def _raise_on_second():
    if os.environ["HOROVOD_RANK"] == "1":
        raise ValueError("bad input on the second worker")
    return 0


def test_tfhvd_run_elastic_returns_the_last_worlds_results(tmp_path):
    import tfhvd
    from tfhvd.runner import RunError

    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1:1\n127.0.0.2:1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    out = tfhvd.run(_rank_and_world, np=2, min_np=1, max_np=2, env=env,
                    host_discovery_script="cat %s" % hostfile, timeout=60,
                    stdout=io.StringIO(), stderr=io.StringIO())
    assert out == [(0, 2), (1, 2)]
    with pytest.raises(RunError, match="ValueError: bad input on the second worker"):
        tfhvd.run(_raise_on_second, np=2, min_np=2, hosts="localhost:2", env=env,
                  timeout=60, stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(TypeError, match="min_nproc"):
        tfhvd.run(_rank_and_world, np=1, min_nproc=1)


def test_elastic_timeout_from_horovods_variable():
    from tfhvd.runner.args import elastic_timeout

    a = parse_args(["--min-np", "1", "--host-discovery-script", "x", "python", "t.py"])
    assert elastic_timeout(a, {"HOROVOD_ELASTIC_TIMEOUT": "42"}) == 42.0
    assert elastic_timeout(a, {}) == 600.0
    with pytest.raises(UsageError, match="HOROVOD_ELASTIC_TIMEOUT"):
        elastic_timeout(a, {"HOROVOD_ELASTIC_TIMEOUT": "soon"})


def test_the_driver_answers_only_its_workers():
    import urllib.error
    import urllib.request

    from tfhvd.runner.elastic import discovery as disc
    from tfhvd.runner.elastic.driver import ElasticDriver
    from tfhvd.runner.elastic.service import ElasticService
    from tfhvd.common.secret import sign_request

    driver = ElasticDriver(disc.HostManager(disc.FixedHosts({"a": 1})), np=1, min_np=1,
                           max_np=None, spawn=lambda w, world: None, terminate=lambda w: None)
    driver.start()
    service = ElasticService(driver, "127.0.0.1", secret="job-secret")
    try:
        url = "http://127.0.0.1:%d/elastic/notify" % service.port
        body = json.dumps({"worker": "a:0", "round": 1, "since": 0, "wait": 0}).encode()
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"))
        wrong = urllib.request.Request(url, data=body, method="POST", headers=sign_request(
            "another-secret", "POST", "/elastic/notify", body))
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(wrong)
        req = urllib.request.Request(url, data=body, method="POST", headers=sign_request(
            "job-secret", "POST", "/elastic/notify", body))
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert json.loads(resp.read()) == {"seq": 0, "update": 0}
    finally:
        service.stop()


def test_waiting_for_slots_says_what_it_has_every_few_seconds(tmp_path, monkeypatch):
    """The README's case: -np 4 from a script that offers localhost:2.  The
    launcher names what it has, what it needs and the hosts while it waits,
    then ends with the timeout error (no worker ever starts)."""
    from tfhvd.runner.elastic import driver as elastic_driver

    monkeypatch.setattr(elastic_driver, "WAIT_PROGRESS_INTERVAL_S", 0.5)
    t0 = time.monotonic()
    code, out, err, recs, job = run_job(tmp_path, ["localhost:2"], 4, {}, "--min-np", "2",
                                        "--elastic-timeout", "3")
    assert code == 1
    assert time.monotonic() - t0 < 30
    lines = [line for line in err.splitlines()
             if "waiting for the 4 slots of -np: 2 of 4 usable" in line]
    assert len(lines) >= 3, err
    assert "(hosts from discovery: localhost:2)" in lines[0], lines[0]
    assert "of --elastic-timeout 3 s" in lines[0], lines[0]
    assert "timed out after 3 s (--elastic-timeout)" in err
    assert not [r for r in recs if r["ev"] == "start"]


def test_waiting_line_names_blacklisted_hosts_and_their_cooldown():
    """A host blacklisted after a failure is still offered by discovery: the
    line said "hosts from discovery: none" and never named the blacklist."""
    from tfhvd.runner.elastic import discovery as disc
    from tfhvd.runner.elastic.driver import ElasticDriver

    clock = [100.0]
    for cooldown, want in ((None, "blacklisted after a failure: b (for the rest of the job: "
                                  "--blacklist-cooldown-range lets a host come back)"),
                           ((10, 20), "blacklisted after a failure: b (back in ")):
        hosts = disc.HostManager(disc.FixedHosts({"a": 1, "b": 2}), cooldown=cooldown,
                                 clock=lambda: clock[0])
        hosts.update_available_hosts()
        hosts.blacklist("b")
        driver = ElasticDriver(hosts, np=3, min_np=3, max_np=None,
                               spawn=lambda w, world: None, terminate=lambda w: None)
        line = driver._progress(3, 1, "at least --min-np 3 slots", 50.0)
        assert "1 of 3 usable (hosts from discovery: a:1, b:2; " + want in line, line
        assert hosts.current_hosts() == [("a", 1)]
