"""Autotune's settings and flags (docs/autotune.md), in one process: the
``tfhvdrun --autotune*`` flags become ``TFHVD_AUTOTUNE*`` variables, bad
values are usage errors, both variable names parse, and a one-rank job tunes
to the end and writes Horovod's log."""

import csv
import os
import subprocess
import sys

import pytest

from tfhvd.common import basics
from tfhvd.runner import build_mpirun_command, parse_args
from tfhvd.runner.args import UsageError, settings_env

ENV = {"PATH": "/usr/bin:/bin"}


def x_values(cmd):
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]


def test_flags_become_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["-np", "2", "--autotune", "--autotune-log-file", "tune.csv",
            "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "3",
            "--autotune-bayes-opt-max-samples", "7", "--autotune-gaussian-process-noise", "0.25",
            "python", "train.py"]
    env = settings_env(parse_args(argv))
    assert env == {"TFHVD_AUTOTUNE": "1", "TFHVD_AUTOTUNE_LOG": str(tmp_path / "tune.csv"),
                   "TFHVD_AUTOTUNE_WARMUP_SAMPLES": "0", "TFHVD_AUTOTUNE_STEPS_PER_SAMPLE": "3",
                   "TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7",
                   "TFHVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.25"}
    values = x_values(build_mpirun_command(parse_args(argv), ENV, uid=1000))
    for k, v in env.items():
        assert "%s=%s" % (k, v) in values
    assert not any(k.startswith("TFHVD_AUTOTUNE")
                   for k in settings_env(parse_args(["-np", "2", "true"])))


@pytest.mark.parametrize("argv,needle", [
    (["--autotune-steps-per-sample", "0"], "expected a whole number >= 1"),
    (["--autotune-bayes-opt-max-samples", "0"], "expected a whole number >= 1"),
    (["--autotune-warmup-samples", "-1"], ">= 0"),
    (["--autotune-gaussian-process-noise", "-0.1"], ">= 0"),
])
def test_flag_errors(argv, needle):
    with pytest.raises(UsageError, match=needle):
        parse_args(["-np", "2"] + argv + ["true"])


def test_both_names_parse(monkeypatch):
    for k in list(os.environ):
        if "AUTOTUNE" in k:
            monkeypatch.delenv(k)
    s = basics.settings()
    assert s["autotune"] == "0" and s["autotune_warmup_samples"] == "3"
    assert s["autotune_steps_per_sample"] == "10" and s["autotune_bayes_opt_max_samples"] == "20"
    assert s["autotune_gaussian_process_noise"] == "0.8"
    monkeypatch.setenv("HOROVOD_AUTOTUNE", "1")
    monkeypatch.setenv("HOROVOD_AUTOTUNE_LOG", "/tmp/x.csv")
    monkeypatch.setenv("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "4")
    monkeypatch.setenv("TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "9")
    s = basics.settings()
    assert s["autotune"] == "1" and s["autotune_log"] == "/tmp/x.csv"
    assert s["autotune_steps_per_sample"] == "4" and s["autotune_bayes_opt_max_samples"] == "9"
    monkeypatch.setenv("TFHVD_AUTOTUNE", "0")  # TFHVD_ wins
    assert basics.settings()["autotune"] == "0"
    monkeypatch.setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "lots")
    with pytest.raises(ValueError, match="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"):
        basics.settings()


def test_state_needs_init():
    """In a fresh process (another test of this session may have initialised
    tfhvd in this one): before hvd.init(), the state is NotInitializedError."""
    code = ("from tfhvd.common import basics\n"
            "from tfhvd.common.exceptions import NotInitializedError\n"
            "assert not basics.is_initialized()\n"
            "try:\n"
            "    basics.autotune_state()\n"
            "except NotInitializedError as e:\n"
            "    print('NOT-INITIALISED', e)\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NOT-INITIALISED" in out.stdout, out.stdout + out.stderr[-3000:]


PROGRAM = r"""
import tensorflow as tf
import tfhvd.tensorflow as hvd
from tfhvd.common import basics
hvd.init()
assert basics.autotune_state()["tuning"] == "1"
xs = [tf.ones([1000 * (i + 1)]) for i in range(4)]
@tf.function
def step():
    return [hvd.allreduce(x, name="t%d" % i) for i, x in enumerate(xs)]
n = 0
while basics.autotune_state()["tuning"] == "1":
    step()
    n += 1
    assert n < 5000, basics.autotune_state()
print("STATE", basics.autotune_state())
"""


def test_one_rank_job_tunes_to_the_end(tmp_path):
    log = tmp_path / "one.csv"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TFHVD_"))}
    env.update({"TFHVD_AUTOTUNE": "1", "TFHVD_AUTOTUNE_LOG": str(log),
                "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "1", "TFHVD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
                "TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "3"})
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(log) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
                       "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold", "score"]
    assert len(rows) == 1 + 3 + 6 + 1, rows
    assert [r[3] for r in rows[4:10]] == ["1", "0"] * 3, rows  # the cache's turns
    assert "'tuning': '0'" in proc.stdout


def test_unwritable_log_fails_init(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "HOROVOD_", "TFHVD_"))}
    env.update({"HOROVOD_AUTOTUNE": "1",
                "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "missing-dir" / "x.csv")})
    proc = subprocess.run([sys.executable, "-c", "import tfhvd.tensorflow as hvd; hvd.init()"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "missing-dir/x.csv" in proc.stderr and "autotune log" in proc.stderr, proc.stderr[-2000:]
