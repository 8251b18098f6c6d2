"""Faults never hang a job: fault injection under ``tfhvdrun -np 2``.

Each job trains tests/integration/scripts/train.py and makes rank R fail at
step S.  The whole job must end within 30 s with a non-zero exit code, and
the output must name the failing rank.
"""

import re
import sys

import pytest

from jobs import clean_env, launch, result_line, train

LIMIT = 30.0  # seconds from a failure to the end of the job (the bound)
# Startup of two TensorFlow processes on a 2-core machine, before any failure.
STARTUP = 25.0


def fault(rank: int, step: int, mode: str, *extra: str, env=None, launcher_args=()):
    return train(2, "--steps", "12", "--step-sleep", "0.1", "--fail-rank", str(rank),
                 "--fail-step", str(step), "--fail-mode", mode, *extra,
                 env=env, launcher_args=launcher_args, timeout=STARTUP + LIMIT + 30)


def injected_at(job) -> None:
    assert "injecting" in job.out, "the fault was never injected: " + job.explain()


def assert_ended_fast(job) -> None:
    assert job.rc != 0, job.explain()
    assert job.seconds < STARTUP + LIMIT, job.explain()


def test_rank_raising_mid_training_ends_the_job():
    job = fault(1, 3, "raise")
    injected_at(job)
    assert_ended_fast(job)
    # The traceback is tagged with the rank that raised...
    assert "[1,1]<stderr>:RuntimeError: injected failure on rank 1 at step 3" in job.err, \
        job.explain()
    # ...the other rank's pending collective fails with an error naming it...
    assert re.search(r"\[1,0\]<stderr>:.*Error: .*ranks \[1\] (have|has) "
                     r"(shut down|exited)", job.err), job.explain()
    # ...and tfhvdrun names the rank that failed first, not the first to exit.
    assert "tfhvdrun: rank 1 raised RuntimeError: injected failure on rank 1" in job.err, \
        job.explain()


def test_killed_rank_ends_the_job():
    job = fault(1, 3, "kill")
    injected_at(job)
    assert_ended_fast(job)
    assert "tfhvdrun: rank 1 was killed by signal 9" in job.err, job.explain()


def test_rank_exiting_without_cleanup_ends_the_job():
    job = fault(1, 3, "exit")
    injected_at(job)
    assert_ended_fast(job)
    assert re.search(r"tfhvdrun: rank 1 (stopped taking part|exited)", job.err), job.explain()


def test_coordinator_raising_ends_the_job():
    job = fault(0, 3, "raise")
    injected_at(job)
    assert_ended_fast(job)
    assert "tfhvdrun: rank 0 raised RuntimeError: injected failure on rank 0" in job.err, \
        job.explain()
    # Rank 1's collectives fail (or it is stopped by mpirun): it never hangs.
    assert "RESULT" not in job.out


# Horovod's variable names and tfhvdrun's flags (which the launcher passes on as
# the TFHVD_ variables; test_stall_shutdown_ends_a_job_whose_rank_hangs sets
# those itself).
STALL_SETTINGS = {
    "horovod env": ({"HOROVOD_STALL_CHECK_TIME_SECONDS": "2",
                     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "8"}, []),
    "tfhvdrun flags": ({}, ["--stall-check-warning-time-seconds", "2",
                            "--stall-check-shutdown-time-seconds", "8"]),
}


@pytest.mark.parametrize("how", sorted(STALL_SETTINGS))
def test_ranks_that_disagree_stall_then_fail(how):
    env_extra, flags = STALL_SETTINGS[how]
    # Rank 1 skips step 3: rank 0 waits in 'loss_3' for rank 1, while rank 1
    # waits in 'loss_4' for rank 0.
    job = fault(1, 3, "skip", env=clean_env(env_extra), launcher_args=flags)
    injected_at(job)
    assert_ended_fast(job)
    # The warning lists each stalled tensor with its missing ranks...
    assert "stall" in job.err, job.explain()
    assert re.search(r"'loss_3' waited \d+ s; missing ranks \[1\]", job.err), job.explain()
    assert re.search(r"'loss_4' waited \d+ s; missing ranks \[0\]", job.err), job.explain()
    # ...and after the shutdown time the stalled collectives fail.
    assert re.search(r"'loss_3' stalled for over 8 s: ranks \[1\] never submitted it",
                     job.err), job.explain()
    assert "tfhvdrun: stalled collective 'loss_3': ranks [1] missing" in job.err, \
        job.explain()


def test_stall_shutdown_ends_a_job_whose_rank_hangs():
    # Rank 1 hangs outside tfhvd forever: only the stall shutdown can end it,
    # and no rank may then hang in its own shutdown.
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "2",
                     "TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    job = fault(1, 3, "hang", env=env)
    injected_at(job)
    assert_ended_fast(job)
    assert re.search(r"stalled for over 5 s: ranks \[1\] never submitted it", job.err), \
        job.explain()
    assert re.search(r"tfhvdrun: rank 1 stopped taking part", job.err), job.explain()


def test_stall_warning_without_shutdown_lets_the_job_finish():
    # A rank that is only slow is reported but not stopped.
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "1"})
    job = fault(1, 3, "pause", "--pause-seconds", "4", env=env)
    assert job.rc == 0, job.explain()
    assert re.search(r"waited \d+ s; missing ranks \[1\]", job.err), job.explain()
    assert result_line(job)["ranks_agree"]


def test_no_stall_check_silences_the_warning():
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "1"})
    job = fault(1, 3, "pause", "--pause-seconds", "4", env=env,
                launcher_args=["--no-stall-check"])
    assert job.rc == 0, job.explain()
    assert "missing ranks" not in job.err, job.explain()


_SHUTDOWN_WITH_A_STUCK_PEER = """
import sys, time, warnings
import tensorflow as tf
import tfhvd.tensorflow as hvd
hvd.init()
hvd.allreduce(tf.ones([4]), name="before")
if hvd.rank() == 1:
    time.sleep(600)  # stuck outside tfhvd: never shuts down
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hvd.shutdown()
print("SHUTDOWN_WARNING", any("did not shut down" in str(w.message) for w in caught), flush=True)
sys.exit(0)
"""


def test_explicit_shutdown_that_gives_up_on_a_stuck_peer_ends_the_job():
    """hvd.shutdown() gives up on a stuck rank after the stall-shutdown time and
    warns; the process's exit then aborts the job instead of waiting for the
    stuck rank in MPI_Finalize (which would hang), and the abandoned runtime is
    kept alive (freeing communicators under a stuck collective could crash)."""
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "1",
                     "TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "3"})
    job = launch(["-np", "2", sys.executable, "-c", _SHUTDOWN_WITH_A_STUCK_PEER],
                 env=env, timeout=STARTUP + LIMIT + 30)
    assert "SHUTDOWN_WARNING True" in job.out, job.explain()
    assert job.rc != 0, job.explain()
    assert job.seconds < STARTUP + LIMIT, job.explain()
