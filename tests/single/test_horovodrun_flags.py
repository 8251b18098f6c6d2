"""Every ``horovodrun`` flag on ``tfhvdrun``, ``--config-file``, and
``tfhvd.run``'s Horovod signature.

Most tests look at the parsed arguments, :func:`settings_env` and the mpirun
command that :func:`build_mpirun_command` would run; one runs a one-rank job
to see ``--prefix-output-with-timestamp`` stamp its output.
"""

import inspect
import io
import os
import re
import sys
import textwrap

import pytest

import tfhvd
from tfhvd.runner import build_mpirun_command, parse_args
from tfhvd.runner.args import UsageError, settings_env
from tfhvd.runner.elastic.api import elastic_argv
from tfhvd.runner.launch import TimestampedStream, main, run_gloo

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def build(argv, env=None):
    return build_mpirun_command(parse_args(argv), ENV if env is None else env, uid=1000)


def x_values(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


def settings(*flags):
    return settings_env(parse_args(["-np", "2", *flags, "true"]))


# Each flag of Horovod's parse_args (horovod/runner/launch.py), with a value
# where it takes one.
HOROVODRUN_FLAGS = [
    ["-np", "2"], ["--num-proc", "2"], ["--disable-cache"], ["--start-timeout", "5"],
    ["--network-interfaces", "eth0,eth1"], ["--network-interface", "eth0"],
    ["--output-filename", "logs"], ["--verbose"], ["--config-file", "CONFIG"],
    ["-p", "2222"], ["--ssh-port", "2222"], ["-i", "KEY"], ["--ssh-identity-file", "KEY"],
    ["--fusion-threshold-mb", "32"], ["--cycle-time-ms", "2"], ["--cache-capacity", "512"],
    ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
    ["--hierarchical-allgather"], ["--no-hierarchical-allgather"],
    ["--torus-allreduce"], ["--no-torus-allreduce"],
    ["--autotune"], ["--no-autotune"], ["--autotune-log-file", "at.csv"],
    ["--autotune-warmup-samples", "2"], ["--autotune-steps-per-sample", "5"],
    ["--autotune-bayes-opt-max-samples", "8"], ["--autotune-gaussian-process-noise", "0.5"],
    ["--min-np", "1"], ["--min-num-proc", "1"], ["--max-np", "4"], ["--max-num-proc", "4"],
    ["--slots-per-host", "2"], ["--elastic-timeout", "60"], ["--reset-limit", "3"],
    ["--blacklist-cooldown-range", "10", "100"],
    ["--timeline-filename", "tl.json"], ["--timeline-mark-cycles"],
    ["--no-timeline-mark-cycles"],
    ["--no-stall-check"], ["--stall-check"], ["--stall-check-warning-time-seconds", "30"],
    ["--stall-check-shutdown-time-seconds", "60"],
    ["--mpi-threads-disable"], ["--no-mpi-threads-disable"], ["--mpi-args=--mca btl tcp,self"],
    ["--tcp"], ["--binding-args=--bind-to core"], ["--num-nccl-streams", "2"],
    ["--thread-affinity", "1"], ["--ccl-bgt-affinity", "1"], ["--gloo-timeout-seconds", "20"],
    ["--log-level", "INFO"], ["--log-with-timestamp"], ["--log-without-timestamp"],
    ["-prefix-timestamp"], ["--prefix-output-with-timestamp"], ["--log-hide-timestamp"],
    ["--no-log-hide-timestamp"],
    ["-H", "localhost:2"], ["--hosts", "localhost:2"], ["-hostfile", "HOSTFILE"],
    ["--hostfile", "HOSTFILE"], ["--host-discovery-script", "./discover.sh"],
    ["--gloo"], ["--mpi"], ["--jsrun"],
]


@pytest.fixture
def files(tmp_path):
    key = tmp_path / "key"
    key.write_text("k")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    config = tmp_path / "c.yaml"
    config.write_text("params:\n  cycle_time_ms: 3\n")
    return {"KEY": str(key), "HOSTFILE": str(hostfile), "CONFIG": str(config)}


@pytest.mark.parametrize("flag", HOROVODRUN_FLAGS, ids=lambda f: f[0])
def test_every_horovodrun_flag_is_accepted(flag, files):
    argv = [files.get(a, a) for a in flag]
    if "-np" not in argv and "--num-proc" not in argv:
        argv = ["-np", "2"] + argv
    args = parse_args(argv + ["python", "train.py"])
    assert args.command == ["python", "train.py"]


@pytest.mark.parametrize("flags,var,value", [
    (["--hierarchical-allreduce"], "TFHVD_HIERARCHICAL_ALLREDUCE", "1"),
    (["--no-hierarchical-allreduce"], "TFHVD_HIERARCHICAL_ALLREDUCE", "0"),
    (["--autotune"], "TFHVD_AUTOTUNE", "1"),
    (["--no-autotune"], "TFHVD_AUTOTUNE", "0"),
    (["--timeline-mark-cycles"], "TFHVD_TIMELINE_MARK_CYCLES", "1"),
    (["--no-timeline-mark-cycles"], "TFHVD_TIMELINE_MARK_CYCLES", "0"),
    (["--no-stall-check"], "TFHVD_STALL_CHECK_DISABLE", "1"),
    (["--stall-check"], "TFHVD_STALL_CHECK_DISABLE", "0"),
    (["--gloo-timeout-seconds", "45"], "TFHVD_GLOO_TIMEOUT_SECONDS", "45"),
    (["--tcp"], "NCCL_IB_DISABLE", "1"),
])
def test_flags_set_the_runtime_setting_on_every_rank(flags, var, value):
    # An "off" flag writes 0, so that it wins over the caller's environment.
    assert "%s=%s" % (var, value) in x_values(build(["-np", "2", *flags, "true"]))


def test_switches_left_out_leave_the_environment_alone():
    assert settings() == {}
    assert settings("--no-hierarchical-allgather", "--no-torus-allreduce",
                    "--log-without-timestamp",
                    "--no-mpi-threads-disable", "--prefix-output-with-timestamp") == {}


@pytest.mark.parametrize("pair", [
    ["--hierarchical-allreduce", "--no-hierarchical-allreduce"],
    ["--hierarchical-allgather", "--no-hierarchical-allgather"],
    ["--torus-allreduce", "--no-torus-allreduce"],
    ["--autotune", "--no-autotune"],
    ["--timeline-mark-cycles", "--no-timeline-mark-cycles"],
    ["--stall-check", "--no-stall-check"],
    ["--mpi-threads-disable", "--no-mpi-threads-disable"],
    ["--log-with-timestamp", "--log-hide-timestamp"],
])
def test_on_and_off_together_is_a_usage_error(pair):
    with pytest.raises(UsageError, match="not allowed with"):
        parse_args(["-np", "2", *pair, "true"])


@pytest.mark.parametrize("argv,needle", [
    (["--num-nccl-streams", "-1"], "--num-nccl-streams: expected a number >= 0"),
    (["--thread-affinity", "core"], "--thread-affinity: expected a number"),
    (["--gloo-timeout-seconds", "0"], "--gloo-timeout-seconds: expected a whole number >= 1"),
    (["--binding-args=--rankfile 'rf"], "--binding-args"),
    (["--gloo", "--jsrun"], "give --gloo or --jsrun, not both"),
    # inf and nan passed the >= check (an OverflowError traceback, or a rank failing at init).
    (["--fusion-threshold-mb", "inf"], "--fusion-threshold-mb: expected a finite number"),
    (["--cycle-time-ms", "nan"], "--cycle-time-ms: expected a finite number"),
])
def test_bad_values_are_usage_errors(argv, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        parse_args(["-np", "2", *argv, "true"])


@pytest.mark.parametrize("flags,name", [
    (["--hierarchical-allgather"], "--hierarchical-allgather"),
    (["--torus-allreduce"], "--torus-allreduce"),
    (["--mpi-threads-disable"], "--mpi-threads-disable"),
    (["--num-nccl-streams", "4"], "--num-nccl-streams"),
    (["--thread-affinity", "2"], "--thread-affinity"),
    (["--ccl-bgt-affinity", "2"], "--ccl-bgt-affinity"),
    (["--log-with-timestamp"], "--log-with-timestamp"),
])
def test_flags_without_an_equivalent_warn_and_set_nothing(flags, name):
    args = parse_args(["-np", "2", *flags, "true"])
    assert len(args.warnings) == 1
    assert args.warnings[0].startswith("tfhvdrun: warning: %s has no effect: " % name)
    assert settings_env(args) == {}


def test_main_prints_a_no_effect_warning_once(capsys):
    # The program does not exist: tfhvdrun stops before starting anything.
    code = main(["-np", "1", "--num-nccl-streams", "2", "/nonexistent/program"])
    err = capsys.readouterr().err
    assert code != 0 and "not found" in err
    assert err.count("--num-nccl-streams has no effect") == 1


def test_jsrun_runs_under_mpirun_with_a_warning():
    args = parse_args(["-np", "2", "--jsrun", "true"])
    assert args.use_mpi and not args.use_gloo
    assert any("--jsrun" in w and "mpirun" in w for w in args.warnings)


def test_prefix_timestamp_is_not_an_ssh_port():
    args = parse_args(["-np", "2", "-prefix-timestamp", "true"])
    assert args.prefix_output_with_timestamp and args.ssh_port is None
    assert parse_args(["-np", "2", "-p", "2222", "true"]).ssh_port == 2222


def test_binding_args_replace_tfhvdruns_binding():
    cmd = build(["-np", "2", "--binding-args=--bind-to core --map-by socket", "true"])
    i = cmd.index("--bind-to")
    assert cmd[i:i + 4] == ["--bind-to", "core", "--map-by", "socket"]
    assert cmd.count("--bind-to") == 1 and cmd.count("--map-by") == 1
    default = build(["-np", "2", "true"])
    assert default[default.index("--bind-to") + 1] == "none"


def test_binding_args_need_mpirun():
    args = parse_args(["-np", "1", "--gloo", "--binding-args=--bind-to core", "true"])
    with pytest.raises(UsageError, match="--binding-args.*without mpirun"):
        run_gloo(args, dict(os.environ))


def test_network_interface_may_be_repeated():
    args = parse_args(["-np", "2", "--network-interface", "eth0", "--network-interface",
                       "eth1", "--network-interfaces", "eth0,eth2", "true"])
    assert args.network_interface == "eth0,eth1,eth2"


def test_timestamped_stream_stamps_each_line_once():
    buf = io.StringIO()
    stream = TimestampedStream(buf, clock=lambda: "T")
    stream.write("[1,0]<stdout>:a\n")
    stream.write("[1,1]<stdout>:b")
    stream.write(" c\nd\n")
    assert buf.getvalue() == "T[1,0]<stdout>:a\nT[1,1]<stdout>:b c\nTd\n"


def test_prefix_output_with_timestamp_stamps_a_real_jobs_lines(capfd):
    code = main(["-np", "1", "--prefix-output-with-timestamp", sys.executable, "-c",
                 "print('stamped line')"])
    out = capfd.readouterr().out
    assert code == 0, out
    # time.asctime(), then the rank's tag, as Horovod writes it.
    stamp = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    assert re.search(r"^%s\[\d+,0\]<stdout>:stamped line$" % stamp, out, re.M), out


# --config-file: Horovod's YAML format.
FULL_CONFIG = """\
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: true
  hierarchical_allgather: false
autotune:
  enabled: true
  log_file: at.csv
  warmup_samples: 5
  steps_per_sample: 20
  bayes_opt_max_samples: 50
  gaussian_process_noise: 0.9
timeline:
  filename: tl.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  gloo_timeout_seconds: 45
logging:
  level: debug
  with_timestamp: false
"""


def config(tmp_path, text):
    path = tmp_path / "horovod.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_config_file_sets_every_section(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = parse_args(["-np", "2", "--config-file", config(tmp_path, FULL_CONFIG), "true"])
    assert settings_env(args) == {
        "TFHVD_FUSION_THRESHOLD": str(32 * 1024 * 1024), "TFHVD_CYCLE_TIME": "10",
        "TFHVD_CACHE_CAPACITY": "2048", "TFHVD_HIERARCHICAL_ALLREDUCE": "1",
        "TFHVD_AUTOTUNE": "1", "TFHVD_AUTOTUNE_LOG": str(tmp_path / "at.csv"),
        "TFHVD_AUTOTUNE_WARMUP_SAMPLES": "5", "TFHVD_AUTOTUNE_STEPS_PER_SAMPLE": "20",
        "TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "50",
        "TFHVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.9",
        "TFHVD_TIMELINE": str(tmp_path / "tl.json"), "TFHVD_TIMELINE_MARK_CYCLES": "1",
        "TFHVD_STALL_CHECK_DISABLE": "1", "TFHVD_STALL_CHECK_TIME_SECONDS": "120",
        "TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "240", "TFHVD_GLOO_TIMEOUT_SECONDS": "45",
        "TFHVD_LOG_LEVEL": "debug"}
    assert args.warnings == []


def test_command_line_flags_win_over_the_config_file(tmp_path):
    path = config(tmp_path, FULL_CONFIG)
    # Before or after --config-file: the command line wins either way.
    env = settings("--cycle-time-ms", "3", "--config-file", path, "--stall-check",
                   "--no-autotune", "--log-level", "error")
    assert env["TFHVD_CYCLE_TIME"] == "3"
    assert env["TFHVD_STALL_CHECK_DISABLE"] == "0"
    assert env["TFHVD_AUTOTUNE"] == "0"
    assert env["TFHVD_LOG_LEVEL"] == "error"
    assert env["TFHVD_CACHE_CAPACITY"] == "2048"  # not on the command line


def test_config_file_controller(tmp_path):
    path = config(tmp_path, "controller: gloo\n")
    assert parse_args(["-np", "1", "--config-file", path, "true"]).use_gloo
    args = parse_args(["-np", "1", "--mpi", "--config-file", path, "true"])
    assert args.use_mpi and not args.use_gloo


def test_config_file_no_effect_settings_warn(tmp_path):
    path = config(tmp_path, "library_options:\n  num_nccl_streams: 2\nextra:\n  a: 1\n"
                            "params:\n  typo_mb: 1\n  torus_allreduce: true\n")
    warnings = parse_args(["-np", "1", "--config-file", path, "true"]).warnings
    assert any("--num-nccl-streams (from --config-file) has no effect" in w for w in warnings)
    assert any("--torus-allreduce (from --config-file) has no effect" in w for w in warnings)
    assert any("unknown section 'extra'" in w for w in warnings)
    assert any("unknown key params.typo_mb" in w for w in warnings)


@pytest.mark.parametrize("text,needle", [
    ("params:\n  fusion_threshold_mb: -1\n", "params.fusion_threshold_mb: expected a number >= 0"),
    ("params:\n  fusion_threshold_mb: .inf\n", "params.fusion_threshold_mb: expected a finite"),
    ("autotune:\n  enabled: maybe\n", "autotune.enabled: expected true or false"),
    ("logging:\n  level: loud\n", "logging.level: expected one of TRACE"),
    ("library_options:\n  gloo_timeout_seconds: 0\n", "gloo_timeout_seconds: expected a whole"),
    ("controller: jsrun\n", "controller: expected gloo or mpi"),
    ("params: 3\n", "section 'params' must be a mapping"),
    ("- a\n- b\n", "expected a mapping of sections"),
    ("params: [\n", "not valid YAML"),
])
def test_bad_config_files_are_usage_errors(tmp_path, text, needle):
    with pytest.raises(UsageError, match=re.escape(needle)):
        parse_args(["-np", "1", "--config-file", config(tmp_path, text), "true"])


def test_missing_config_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read it"):
        parse_args(["-np", "1", "--config-file", str(tmp_path / "none.yaml"), "true"])


# tfhvd.run: horovod.runner.run's keywords, in its order.
HOROVOD_RUN_PARAMETERS = [
    "func", "args", "kwargs", "num_proc", "min_num_proc", "max_num_proc", "slots",
    "reset_limit", "cooldown_range", "hosts", "hostfile", "host_discovery_script",
    "start_timeout", "ssh_port", "ssh_identity_file", "disable_cache", "output_filename",
    "verbose", "use_gloo", "use_mpi", "mpi_args", "network_interface", "network_interfaces",
    "executable", "np", "min_np", "max_np"]


def where_am_i(offset):
    return offset


def test_run_has_horovods_signature():
    params = list(inspect.signature(tfhvd.run).parameters.values())
    positional = [p.name for p in params
                  if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == HOROVOD_RUN_PARAMETERS


def test_run_takes_host_discovery_script_in_horovods_position():
    # The 12th positional argument, after hostfile, as in horovod.run: the
    # script is run (and fails) before any rank starts.
    with pytest.raises(Exception, match="discovery script ./nonexistent/discover.sh. failed"):
        tfhvd.run(where_am_i, (), None, 2, None, None, None, None, None, None, None,
                  "/nonexistent/discover.sh", timeout=30)


def test_run_takes_network_interfaces_and_the_deprecated_network_interface():
    from tfhvd.runner.api import _interfaces

    assert _interfaces(None, ["eth0", "eth1"]) == "eth0,eth1"
    assert _interfaces(None, "eth0,eth1") == "eth0,eth1"
    assert _interfaces(None, None) is None
    with pytest.warns(DeprecationWarning, match="network_interfaces"):
        assert _interfaces("eth0,eth1", None) == "eth0,eth1"
    with pytest.warns(DeprecationWarning):
        assert _interfaces("eth1,eth0", ["eth0", "eth1"]) == "eth0,eth1"
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="disagree"):
        _interfaces("lo", ["eth0"])
    with pytest.raises(ValueError, match="each entry is one interface name"):
        _interfaces(None, ["eth0,eth1"])
    # It reaches the launcher's checks (not a TypeError for an unknown keyword).
    with pytest.raises(ValueError, match="-np 3 is larger than the 1 slot"):
        tfhvd.run(where_am_i, num_proc=3, hosts="localhost:1", network_interfaces=["lo"],
                  timeout=30)


# Every call below fails its checks before any process starts; the timeout
# only bounds a regression that would start a job.
@pytest.mark.parametrize("call", [
    lambda: tfhvd.run(where_am_i, num_proc=3, hosts="localhost:1", timeout=30),
    lambda: tfhvd.run(where_am_i, np=3, hosts="localhost:1", timeout=30),
    lambda: tfhvd.run(where_am_i, (), None, 3, hosts="localhost:1", timeout=30),
    lambda: tfhvd.run(where_am_i, num_proc=3, np=3, hosts="localhost:1", timeout=30),
], ids=["num_proc", "np", "positional", "both-equal"])
def test_run_takes_num_proc_and_np(call):
    # -np 3 does not fit one slot.
    with pytest.raises(ValueError, match="-np 3 is larger than the 1 slot"):
        call()


def test_run_num_proc_reaches_an_elastic_job():
    with pytest.raises(ValueError, match="--min-np 3 is larger than -np 2"):
        tfhvd.run(where_am_i, num_proc=2, min_num_proc=3, timeout=30)


@pytest.mark.parametrize("kwargs,needle", [
    ({"num_proc": 2, "np": 3}, "num_proc=2 and np=3 disagree"),
    ({"min_num_proc": 1, "min_np": 2}, "min_num_proc=1 and min_np=2 disagree"),
    ({"max_num_proc": 4, "max_np": 2}, "max_num_proc=4 and max_np=2 disagree"),
])
def test_run_rejects_both_names_with_different_values(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        tfhvd.run(where_am_i, timeout=30, **kwargs)


def test_elastic_keywords_old_and_new_names_give_one_flag():
    argv = elastic_argv(2, None, {"min_num_proc": 1, "min_np": 1}, ["cmd"])
    assert argv == ["-np", "2", "--min-np", "1", "--", "cmd"]
