"""TFHVD_NCCL_TIMEOUT: the deadline of every wait for GPU work (the NCCL
backend ends the job past it instead of hanging).  Parsed in the core's
settings, so a CPU build checks it too."""

import pytest

import tfhvd.tensorflow as hvd

VARS = ("TFHVD_NCCL_TIMEOUT", "HOROVOD_NCCL_TIMEOUT", "TFHVD_STALL_SHUTDOWN_TIME_SECONDS",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")


@pytest.fixture
def clean_env(monkeypatch):
    for v in VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


@pytest.mark.parametrize("env,want", [
    ({}, "30"),                                               # the default
    ({"TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "45"}, "45"),      # follows the stall shutdown
    ({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "45", "TFHVD_NCCL_TIMEOUT": "7.5"}, "7.5"),
    ({"HOROVOD_NCCL_TIMEOUT": "30"}, "30"),
])
def test_nccl_timeout_default_and_names(clean_env, env, want):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert hvd.settings()["nccl_timeout_s"] == want


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_nccl_timeout_must_be_a_positive_number(clean_env, value):
    clean_env.setenv("TFHVD_NCCL_TIMEOUT", value)
    with pytest.raises(ValueError, match="TFHVD_NCCL_TIMEOUT"):
        hvd.settings()


@pytest.mark.parametrize("env,want", [
    ({}, "0"),
    ({"HOROVOD_ELASTIC": "1"}, "1"),   # what the elastic launchers set
    ({"TFHVD_ELASTIC": "1"}, "1"),
])
def test_elastic_setting_makes_gpu_failures_errors(monkeypatch, env, want):
    """TFHVD_ELASTIC / HOROVOD_ELASTIC: the NCCL backend keeps a failed GPU
    collective an error (then aborts its communicators at the reset) instead of
    ending the job (make test-fake-gpu runs that case)."""
    for v in ("TFHVD_ELASTIC", "HOROVOD_ELASTIC"):
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert hvd.settings()["elastic"] == want
