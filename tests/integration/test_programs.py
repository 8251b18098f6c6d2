"""The test programs of programs/ (written the way Horovod's users write theirs:
``import tfhvd.tensorflow as hvd``, ``tfhvd.tensorflow.keras``, ``tfhvd.keras``)
run on 2 ranks under ``tfhvdrun`` and do what they claim.

Every program trains on data made offline (scikit-learn's digits, a made-up
corpus, random images) and prints ``weights on rank R: SUM SUMSQ`` at the end;
each test checks that both ranks end with the same weights (which fails when
the gradient average or the initial broadcast is missing), besides the
program's own output: its loss going down, the checkpoint rank 0 writes, the
metrics and learning rate the Keras callbacks set, the IndexedSlices the
embedding's gradients stay, the float16 the compressed gradients carry.

Programs that use TF1 names under ``tf.compat.v1`` with Keras models
(``--tf1-optimizer``, ``--api session``) or TF 2.x Keras habits run under
tf-keras (``TF_USE_LEGACY_KERAS=1``); the rest under Keras 3, TensorFlow 2.21's
default, and the Keras programs under both.
"""

import os
import re
import sys
from typing import Dict, List, Optional

import pytest

from jobs import Job, clean_env, launch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
BENCH = ["--model", "MobileNetV2", "--image-size", "64", "--batch-size", "2",
         "--warmup-steps", "1", "--steps-per-iter", "1", "--iters", "2", "--cpu"]
KERAS3_COMPILE_WARNING = "compile(experimental_run_tf_function) is an argument of TF 2.x"


def run_program(script: str, args: List[str], tmp_path, legacy_keras: bool) -> Job:
    env = clean_env({"TF_USE_LEGACY_KERAS": "1"} if legacy_keras else {})
    if not legacy_keras:
        env.pop("TF_USE_LEGACY_KERAS", None)
    job = launch(["-np", "2", sys.executable, os.path.join(HERE, script)] + args,
                 env=env, cwd=str(tmp_path), timeout=420)
    assert job.rc == 0, job.explain()
    return job


def per_rank(job: Job, pattern: str) -> Dict[int, str]:
    """``{rank: rest}`` for lines ``<pattern with (\\d+) for the rank> rest``."""
    found = {}
    for m in re.finditer(pattern + r"\s*(.*)$", job.output, re.M):
        found[int(m.group(1))] = m.group(2).strip()
    return found


def assert_same_weights(job: Job) -> None:
    weights = per_rank(job, r"weights on rank (\d+):")
    assert sorted(weights) == [0, 1], job.explain()
    assert weights[0] == weights[1], (weights, job.explain())


def losses(job: Job, pattern: str) -> List[float]:
    return [float(v) for v in re.findall(pattern, job.output)]


@pytest.mark.parametrize("legacy_keras,args", [(False, []), (True, ["--eager", "--tf1-optimizer"])],
                         ids=["keras3 tf.function", "tf-keras eager tf1-optimizer"])
def test_gradient_tape_loop(legacy_keras, args, tmp_path):
    job = run_program("tape_digits.py", ["--steps", "40"] + args, tmp_path, legacy_keras)
    assert "step 0: loss" in job.output, job.explain()
    values = losses(job, r"step \d+: loss ([0-9.]+)")
    assert values[-1] < values[0] * 0.6, (values, job.explain())  # it learned
    assert (tmp_path / "ckpt" / "checkpoint").exists(), job.explain()  # rank 0's checkpoint
    assert any(p.name.startswith("digits-") for p in (tmp_path / "ckpt").iterdir())
    assert_same_weights(job)


@pytest.mark.parametrize("legacy_keras,args", [(True, []), (False, ["--keras-package"])],
                         ids=["tf-keras tfhvd.tensorflow.keras", "keras3 tfhvd.keras"])
def test_keras_fit_with_callbacks(legacy_keras, args, tmp_path):
    job = run_program("keras_fit_digits.py", ["--epochs", "3", "--warmup-epochs", "1",
                                              "--lr", "0.002"] + args, tmp_path, legacy_keras)
    assert "Epoch 3/3" in job.output, job.explain()
    assert (tmp_path / "checkpoint-3.weights.h5").exists(), job.explain()  # rank 0's checkpoints
    assert "finished gradual learning rate warmup to 0.004" in job.output, job.explain()
    # MetricAverageCallback: the epoch logs are the same averages on both ranks.
    logs = per_rank(job, r"rank (\d+) final epoch:")
    assert sorted(logs) == [0, 1] and logs[0] == logs[1], (logs, job.explain())
    val_accuracy = float(re.search(r"val_accuracy=([0-9.]+)", logs[0]).group(1))
    assert val_accuracy > 0.6, job.explain()
    # Warm-up to 0.002 * 2 ranks in epoch 0, then halved each epoch from epoch 1.
    rates = per_rank(job, r"rank (\d+) learning rate:")
    assert [float(rates[r]) for r in (0, 1)] == [pytest.approx(0.002)] * 2, job.explain()
    if not legacy_keras:
        assert KERAS3_COMPILE_WARNING in job.output, job.explain()
    assert_same_weights(job)


def test_tf1_monitored_training_session(tmp_path):
    job = run_program("tf1_monitored_session.py", ["--steps", "200"], tmp_path, False)
    values = losses(job, r"global step \d+: loss ([0-9.]+)")
    assert "global step 200: loss" in job.output and values[-1] < values[0] / 5, job.explain()
    accuracy = per_rank(job, r"rank (\d+) test accuracy:")
    assert sorted(accuracy) == [0, 1] and min(float(a) for a in accuracy.values()) > 0.8
    train_dir = tmp_path / "train_dir"
    assert (train_dir / "checkpoint").exists(), job.explain()  # rank 0 alone has a directory
    assert (train_dir / "model.ckpt-200.index").exists(), sorted(os.listdir(train_dir))
    assert_same_weights(job)


def test_sparse_embedding_gradients(tmp_path):
    steps, every = 2000, 250
    job = run_program("sparse_embedding.py", ["--steps", str(steps), "--report-every", str(every)],
                      tmp_path, False)
    corpora = per_rank(job, r"rank (\d+) corpus:")
    assert sorted(corpora) == [0, 1] and corpora[0] == corpora[1], job.explain()  # same data
    assert "gradient types: emb IndexedSlices, out_w IndexedSlices, out_b IndexedSlices" \
        in job.output, job.explain()
    assert "rank 1 initialized from rank 0" in job.output, job.explain()
    values = losses(job, r"average loss at step \d+: ([0-9.]+)")
    assert len(values) == 2 * (steps // every + 1), job.explain()  # both ranks, every report
    assert max(values[-2:]) < min(values[:2]) / 10, job.explain()  # it learned
    right = float(re.search(r"next word right for ([0-9.]+)%", job.output).group(1))
    assert right > 90, job.explain()
    assert len(re.findall(r"nearest to w\d+: (?:w\d+ ?){5}", job.output)) == 4, job.explain()
    assert_same_weights(job)


def _fp16_line(job: Job) -> Optional[str]:
    m = re.search(r"averaged gradients exactly float16: (yes|no)", job.output)
    return m.group(1) if m else None


BENCH_CASES = [
    # (api, fp16, legacy Keras): each API once, each Keras once per API that has
    # both, fp16 on and off (a MobileNetV2 job costs about a minute here).
    ("tape", False, False),
    ("fit", False, True),
    ("fit", False, False),
    ("session", True, True),
]


@pytest.mark.parametrize("api,fp16,legacy_keras", BENCH_CASES,
                         ids=["%s%s %s" % (a, " fp16" if f else "", "tf-keras" if k else "keras3")
                              for a, f, k in BENCH_CASES])
def test_synthetic_benchmark(api, fp16, legacy_keras, tmp_path):
    args = BENCH + ["--api", api] + (["--fp16-allreduce"] if fp16 else [])
    job = run_program("synthetic_benchmark.py", args, tmp_path, legacy_keras)
    total = re.search(r"2 CPU\(s\) together: ([0-9.]+) images/sec", job.output)
    assert total and float(total.group(1)) > 0, job.explain()
    if api != "fit":  # the exchange's dtype, seen in the averaged gradients
        assert _fp16_line(job) == ("yes" if fp16 else "no"), job.explain()
    if api == "fit" and not legacy_keras:
        assert KERAS3_COMPILE_WARNING in job.output, job.explain()
    assert_same_weights(job)
