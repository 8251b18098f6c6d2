"""Parallel tests run under `mpirun -np N`; every rank runs every test in the same
order, so each test must call the same collectives on every rank, even when an
assertion is about to fail."""

import pytest

import tfhvd.tensorflow as hvd


@pytest.fixture(scope="session", autouse=True)
def hvd_initialized():
    hvd.init()
    yield
