"""Autotune in real jobs (docs/autotune.md): ``tfhvdrun --autotune`` and
Horovod's ``HOROVOD_AUTOTUNE*`` variables.  The log has Horovod's header and
one row per sample; the setting changes from sample to sample; every rank
applies the same changes in the same order; the sums stay right throughout;
tuning ends with the best row kept."""

import csv
import os
import statistics
import sys

import pytest

from jobs import SCRIPTS, clean_env, launch, result_line

PROBE = os.path.join(SCRIPTS, "autotune_probe.py")
HEADER = ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
          "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold", "score"]


def read_log(path):
    with open(path) as f:
        return list(csv.reader(f))


def check_job(job, log, max_samples, cache_tuned=True):
    assert job.rc == 0, job.explain()
    result = result_line(job)
    rows = read_log(log)
    assert rows[0] == HEADER, rows[0]
    body = rows[1:]
    # One row per sample after the warm-up (Bayesian ones, then three turns
    # of each cache value), then the best setting.
    assert len(body) == max_samples + (6 if cache_tuned else 0) + 1, body
    for r in body:
        assert len(r) == 7, r
        assert float(r[6]) > 0, r
        assert 0 <= float(r[5]) <= 64 and 0 <= float(r[4]) <= 5, r
    settings = [tuple(r[3:6]) for r in body[:-1]]
    assert len(set(settings)) >= 3, settings  # it tried different settings
    best = body[-1]
    # The kept setting: the Bayesian sample with the highest score, and the
    # cache value whose turns had the better median.
    bayes = body[:max_samples]
    top = max(bayes, key=lambda r: float(r[6]))
    assert best[4:6] == top[4:6], (best, top)
    if cache_tuned:
        turns = body[max_samples:-1]
        assert [r[3] for r in turns] == ["1", "0"] * 3, turns
        assert all(r[4:6] == top[4:6] for r in turns), turns
        med = {v: statistics.median(float(r[6]) for r in turns if r[3] == v) for v in "10"}
        assert best[3] == max(med, key=med.get) and float(best[6]) == max(med.values()), (
            best, med)
    states = result["states"]
    assert len(states) == 2
    # Every rank applied the same changes in the same order, and ended with
    # tuning done on the kept setting.
    assert states[0]["applied"] == states[1]["applied"], states
    applied = states[0]["applied"].split(";")
    assert len(applied) >= 3, applied
    assert len({a.split(":")[1:4].__str__() for a in applied}) >= 3, applied
    for s in states:
        assert s["tuning"] == "0", s
    last = applied[-1].split(":")
    assert last[4] == "0", applied  # the final change ends tuning
    assert abs(int(last[1]) / (1024 * 1024) - float(best[5])) < 1e-3, (last, best)
    assert float(last[2]) == float(best[4]) and last[3] == best[3], (last, best)
    return body


@pytest.mark.parametrize("transport", [[], ["--gloo"]], ids=["mpi", "gloo"])
def test_tfhvdrun_autotune_flags(tmp_path, transport):
    log = tmp_path / "autotune.csv"
    job = launch(["-np", "2"] + transport + ["--autotune", "--autotune-log-file", str(log),
                  "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "1",
                  "--autotune-bayes-opt-max-samples", "5",
                  "--autotune-gaussian-process-noise", "0.5",
                  sys.executable, PROBE, "--steps", "120"], env=clean_env(), timeout=240)
    check_job(job, log, max_samples=5)


def test_horovod_autotune_variables_and_a_fixed_knob(tmp_path):
    # HOROVOD_* names as a Horovod job script sets them; a fusion threshold
    # the user set is kept (not tuned), so every row shows it.
    log = tmp_path / "hvd.csv"
    env = clean_env({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(log),
                     "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "0",
                     "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "1",
                     "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4",
                     "HOROVOD_FUSION_THRESHOLD": str(2 * 1024 * 1024)})
    job = launch(["-np", "2", sys.executable, PROBE, "--steps", "100"], env=env, timeout=240)
    body = check_job(job, log, max_samples=4)
    assert {r[5] for r in body} == {"2"}, body


def test_no_autotune_no_log(tmp_path):
    log = tmp_path / "none.csv"
    job = launch(["-np", "2", sys.executable, PROBE, "--steps", "20"],
                 env=clean_env({"TFHVD_AUTOTUNE_LOG": str(log)}), timeout=180)
    assert job.rc == 0, job.explain()
    assert not log.exists()
    states = result_line(job)["states"]
    assert states[0]["applied"] == "" and states[1]["applied"] == "", states
