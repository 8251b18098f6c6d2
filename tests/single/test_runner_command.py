"""The tfhvdrun command line and host handling, without starting a job.

``build_mpirun_command`` is pure, so every flag's effect on the mpirun
command is checked here exactly.
"""

import os
import shutil
import socket
import threading
import time

import pytest

from tfhvd.runner import build_mpirun_command, parse_args
from tfhvd.runner import hosts as hostlib
from tfhvd.runner.args import UsageError, settings_env, start_timeout
from tfhvd.runner.hosts import HostError, HostSlots
from tfhvd.runner.launch import (EXIT_NO_MPIRUN, LaunchError, check_program, find_mpirun,
                                 forwarded_env, main)

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root", "LD_LIBRARY_PATH": "/opt/lib",
       "PYTHONPATH": "/src", "TFHVD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1024",
       "NCCL_DEBUG": "INFO", "TF_CPP_MIN_LOG_LEVEL": "2", "OMPI_MCA_foo": "1",
       "AWS_SECRET_ACCESS_KEY": "x", "TFHVDX": "yes", "OMP_NUM_THREADS": "4",
       "BASH_FUNC_f%%": "() { :; }", "OLDPWD": "/old", "PWD": "/here", "HOSTNAME": "launcher",
       "SSH_AUTH_SOCK": "/tmp/agent", "CUDA_VISIBLE_DEVICES": "0", "PMIX_RANK": "0",
       "_": "/usr/bin/tfhvdrun", "SHLVL": "2"}


def build(argv, env=None, uid=1000):
    return build_mpirun_command(parse_args(argv), ENV if env is None else env, uid=uid)


def x_values(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


def mca(cmd, name):
    return [cmd[i + 2] for i, a in enumerate(cmd) if a == "--mca" and cmd[i + 1] == name]


def test_minimal_command_runs_every_rank_on_localhost():
    cmd = build(["-np", "3", "python", "train.py"])
    assert cmd[0] == "mpirun"
    assert "--allow-run-as-root" not in cmd
    assert cmd[cmd.index("-np") + 1] == "3"
    # Slots, not cores, decide how many ranks fit on this machine.
    assert cmd[cmd.index("-H") + 1] == "localhost:3"
    assert "--tag-output" in cmd
    assert cmd[-2:] == ["python", "train.py"]


def test_root_gets_allow_run_as_root():
    assert "--allow-run-as-root" in build(["-np", "1", "true"], uid=0)
    assert "--allow-run-as-root" not in build(["-np", "1", "true"], uid=1)


def test_binding_and_transport_defaults_and_their_overrides():
    cmd = build(["-np", "2", "true"])
    assert cmd[cmd.index("--bind-to") + 1] == "none"
    assert cmd[cmd.index("--map-by") + 1] == "slot"
    assert mca(cmd, "pml") == ["ob1"]
    assert mca(cmd, "btl") == ["^openib"]
    cmd = build(["-np", "2", "--mpi-args=--bind-to core --map-by socket --mca btl tcp,self "
                 "-mca pml ucx", "true"])
    assert cmd.count("--bind-to") == 1 and cmd[cmd.index("--bind-to") + 1] == "core"
    assert cmd.count("--map-by") == 1 and cmd[cmd.index("--map-by") + 1] == "socket"
    assert mca(cmd, "btl") == ["tcp,self"]
    assert "ob1" not in cmd
    # --mpi-args come after the defaults and before the program.
    assert cmd.index("--bind-to") < cmd.index("true")


def test_hosts_and_hostfile_become_H(tmp_path):
    cmd = build(["-np", "4", "-H", "hostA:2,hostB:2", "python", "t.py"])
    assert cmd[cmd.index("-H") + 1] == "hostA:2,hostB:2"
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nhostA slots=2\nhostB:3  # comment\n\nhostC\n")
    cmd = build(["-np", "6", "--hostfile", str(hf), "python", "t.py"])
    assert cmd[cmd.index("-H") + 1] == "hostA:2,hostB:3,hostC:1"


def test_ssh_port_identity_and_network_interface(tmp_path):
    key = tmp_path / "id_test"
    key.write_text("not really a key")
    cmd = build(["-np", "2", "-H", "a:1,b:1", "-p", "2222", "-i", str(key),
                 "--network-interface", "eth1", "python", "t.py"])
    assert mca(cmd, "plm_rsh_args") == ["-p 2222 -i %s" % key]
    assert mca(cmd, "btl_tcp_if_include") == ["eth1"]
    assert mca(cmd, "oob_tcp_if_include") == ["eth1"]
    assert "NCCL_SOCKET_IFNAME=eth1" in x_values(cmd)
    assert "TFHVD_SOCKET_IFNAME=eth1" in x_values(cmd)
    # A subnet steers MPI but is not an interface name NCCL would take.
    cmd = build(["-np", "2", "--network-interface", "198.18.0.0/24", "true"])
    assert mca(cmd, "btl_tcp_if_include") == ["198.18.0.0/24"]
    assert not any(v.startswith("NCCL_SOCKET_IFNAME") for v in x_values(cmd))


def test_environment_forwarding():
    # Every variable, as horovodrun's -x list (env_util.is_exportable), so a
    # rank on another host sees the user's settings and keys too; not what
    # belongs to the launcher's host, shell or an enclosing MPI job.
    names = forwarded_env(ENV)
    assert names == sorted(["AWS_SECRET_ACCESS_KEY", "HOME", "HOROVOD_FUSION_THRESHOLD",
                            "LD_LIBRARY_PATH", "NCCL_DEBUG", "OMP_NUM_THREADS", "PATH",
                            "PYTHONPATH", "TFHVDX", "TFHVD_CYCLE_TIME", "TF_CPP_MIN_LOG_LEVEL"])
    values = x_values(build(["-np", "1", "true"]))
    for name in names:
        assert name in values
    for local in ("OMPI_MCA_foo", "BASH_FUNC_f%%", "OLDPWD", "PWD", "HOSTNAME",
                  "SSH_AUTH_SOCK", "CUDA_VISIBLE_DEVICES", "PMIX_RANK", "_", "SHLVL"):
        assert not any(v.split("=")[0] == local for v in values), local
    # -x NAME: mpirun reads the value from its own environment, so no value
    # (a key's least of all) is written on its command line.
    assert "AWS_SECRET_ACCESS_KEY" in values and not any("=x" in v for v in values)


@pytest.mark.parametrize("flag,value,var,expected", [
    ("--fusion-threshold-mb", "32", "TFHVD_FUSION_THRESHOLD", str(32 * 1024 * 1024)),
    ("--fusion-threshold-mb", "0.5", "TFHVD_FUSION_THRESHOLD", str(512 * 1024)),
    ("--cycle-time-ms", "2.5", "TFHVD_CYCLE_TIME", "2.5"),
    ("--cache-capacity", "0", "TFHVD_CACHE_CAPACITY", "0"),
    ("--log-level", "debug", "TFHVD_LOG_LEVEL", "debug"),
    ("--stall-check-warning-time-seconds", "7", "TFHVD_STALL_CHECK_TIME_SECONDS", "7"),
    ("--stall-check-shutdown-time-seconds", "30", "TFHVD_STALL_SHUTDOWN_TIME_SECONDS", "30"),
])
def test_tuning_flags_set_tfhvd_variables(flag, value, var, expected):
    cmd = build(["-np", "2", flag, value, "true"])
    assert "%s=%s" % (var, expected) in x_values(cmd)


def test_switch_flags_and_timeline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = build(["-np", "2", "--no-stall-check", "--disable-cache", "--timeline-filename",
                 "tl.json", "--timeline-mark-cycles", "true"])
    values = x_values(cmd)
    assert "TFHVD_STALL_CHECK_DISABLE=1" in values
    assert "TFHVD_CACHE_CAPACITY=0" in values
    # Ranks may run elsewhere: the path is made absolute.
    assert "TFHVD_TIMELINE=%s" % (tmp_path / "tl.json") in values
    assert "TFHVD_TIMELINE_MARK_CYCLES=1" in values


def test_flags_win_over_the_environment():
    env = dict(ENV, TFHVD_CYCLE_TIME="5")
    values = x_values(build(["-np", "2", "--cycle-time-ms", "1", "true"], env=env))
    assert "TFHVD_CYCLE_TIME=1" in values and "TFHVD_CYCLE_TIME" not in values


def test_program_arguments_pass_through_untouched():
    cmd = build(["-np", "2", "python", "train.py", "--epochs", "3", "-np", "a b"])
    assert cmd[-6:] == ["python", "train.py", "--epochs", "3", "-np", "a b"]
    assert build(["-np", "1", "--", "python", "-c", "print(1)"])[-3:] == [
        "python", "-c", "print(1)"]


def test_output_filename_is_written_by_the_launcher_not_mpirun():
    # mpirun's files would carry --tag-output's tags; run_job writes clean ones.
    assert "--output-filename" not in build(["-np", "1", "--output-filename", "logs", "true"])


@pytest.mark.parametrize("argv,needle", [
    (["python", "t.py"], "-np/--num-proc is required"),
    (["-np", "2"], "no command given"),
    (["-np", "0", "true"], "expected a whole number >= 1"),
    (["-np", "two", "true"], "expected a whole number"),
    (["-np", "2", "-H", "a:1", "--hostfile", "f", "true"], "not both"),
    (["-np", "2", "--gloo", "--mpi", "true"], "not both"),
    (["-np", "2", "--fusion-threshold-mb", "-1", "true"], "expected a number >= 0"),
    (["-np", "2", "--log-level", "loud", "true"], "invalid choice"),
    (["-np", "2", "-i", "/nonexistent/key", "true"], "no such file"),
])
def test_usage_errors(argv, needle):
    with pytest.raises(UsageError, match=needle):
        parse_args(argv)


@pytest.mark.parametrize("text,needle", [
    ("hostA:2,,hostB:2", "empty entry"),
    ("hostA:two", "slots must be a whole number"),
    ("hostA:0", "slots must be a whole number >= 1"),
    (":2", "has no host name"),
    ("host A:2", "not a valid host name"),
    ("hostA:1,hostA:2", "listed twice"),
    ("fe80::1:2", "IPv6 addresses in brackets"),
])
def test_host_lists_that_do_not_parse(text, needle):
    with pytest.raises(HostError, match=needle):
        hostlib.parse_hosts(text)
    with pytest.raises(HostError, match=needle):
        build(["-np", "1", "-H", text, "true"])


def test_host_list_forms():
    assert hostlib.parse_hosts("a:2, b ,[::1]:3") == [
        HostSlots("a", 2), HostSlots("b", 1), HostSlots("[::1]", 3)]
    assert hostlib.total_slots(hostlib.parse_hosts("a:2,b:5")) == 7


def test_np_larger_than_slots():
    with pytest.raises(HostError, match=r"-np 5 is larger than the 4 slots of -H a:2,b:2"):
        build(["-np", "5", "-H", "a:2,b:2", "true"])


def test_bad_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("hostA slots=2\nhostB cores=2\n")
    with pytest.raises(HostError, match="line 2: expected 'host slots=N'"):
        hostlib.parse_hostfile(str(hf))
    with pytest.raises(HostError, match="cannot read it"):
        hostlib.parse_hostfile(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(HostError, match="no hosts given"):
        hostlib.parse_hostfile(str(tmp_path / "empty"))


def test_start_timeout_sources():
    args = parse_args(["-np", "1", "true"])
    assert start_timeout(args, {}) == 30
    assert start_timeout(args, {"HOROVOD_START_TIMEOUT": "12"}) == 12
    assert start_timeout(args, {"TFHVD_START_TIMEOUT": "5", "HOROVOD_START_TIMEOUT": "12"}) == 5
    assert start_timeout(parse_args(["-np", "1", "--start-timeout", "3", "true"]),
                         {"HOROVOD_START_TIMEOUT": "12"}) == 3
    with pytest.raises(UsageError, match="HOROVOD_START_TIMEOUT"):
        start_timeout(args, {"HOROVOD_START_TIMEOUT": "soon"})


def test_settings_env_is_empty_without_flags():
    assert settings_env(parse_args(["-np", "1", "true"])) == {}


def test_local_host_detection():
    assert hostlib.is_local_host("localhost")
    assert hostlib.is_local_host("127.0.0.1")
    assert hostlib.is_local_host(socket.gethostname())
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.  Binding
    # sends nothing on the network.
    assert not hostlib.is_local_host("192.0.2.1")


def test_ssh_command_follows_mpiruns_agent():
    assert hostlib.ssh_base_command("ssh", 2222, "/k") == ["ssh", "-p", "2222", "-i", "/k"]
    assert hostlib.ssh_base_command("ssh -F /cfg : rsh", None, None) == ["ssh", "-F", "/cfg"]
    assert hostlib.rsh_agent({}, []) == "ssh"
    assert hostlib.rsh_agent({"OMPI_MCA_plm_rsh_agent": "ssh -q"}, []) == "ssh -q"
    assert hostlib.rsh_agent({"OMPI_MCA_plm_rsh_agent": "ssh -q"},
                             ["--mca", "plm_rsh_agent", "rsh"]) == "rsh"


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client installed")
def test_check_ssh_gives_up_on_a_silent_host_within_the_timeout():
    # A listener that accepts and never speaks: ssh would wait for its banner.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        start = time.monotonic()
        failed = hostlib.check_ssh(["127.0.0.1"], ["ssh", "-p", str(port)], timeout=2)
        took = time.monotonic() - start
    finally:
        stop.set()
        t.join()
        srv.close()
        for c in conns:
            c.close()
    assert failed and failed[0][0] == "127.0.0.1"
    assert took < 8, "check_ssh took %.1f s with a 2 s timeout" % took


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client installed")
def test_check_ssh_reports_sshs_error():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    failed = hostlib.check_ssh(["127.0.0.1"], ["ssh", "-p", str(port)], timeout=5)
    assert failed and "refused" in failed[0][1].lower()


def test_missing_mpirun_says_how_to_install(tmp_path):
    with pytest.raises(LaunchError, match="apt-get install -y openmpi-bin") as e:
        find_mpirun({"PATH": str(tmp_path)})
    assert e.value.code == EXIT_NO_MPIRUN


def test_missing_program_or_script(tmp_path):
    with pytest.raises(LaunchError, match="script 'nope.py' does not exist"):
        check_program(["python3", "nope.py"], {"PATH": os.environ["PATH"]})
    with pytest.raises(LaunchError, match="program 'no-such-program-xyz' not found on PATH"):
        check_program(["no-such-program-xyz"], {"PATH": os.environ["PATH"]})
    check_program(["python3", "-c", "pass"], {"PATH": os.environ["PATH"]})


def test_main_exit_codes_for_bad_input(capsys):
    assert main(["-np", "2", "-H", "a:2,,b", "true"]) == 2
    assert "empty entry" in capsys.readouterr().err
    assert main(["-np", "9", "-H", "a:2", "true"]) == 2
    assert "larger than the 2 slots" in capsys.readouterr().err
    assert main(["-np", "1", "python3", "/nonexistent/train.py"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--bogus-flag"]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err
