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
