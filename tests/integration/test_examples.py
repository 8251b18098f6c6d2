"""The examples a newcomer copies from run as documented (tiny settings):
each finishes under ``tfhvdrun -np 2`` and prints what its docstring says.
These check that the scripts work, not how fast: timings are for reading."""

import os
import re
import sys

from jobs import ROOT, launch

PY = sys.executable


def example(name: str, *args: str, timeout: float = 240):
    job = launch(["-np", "2", PY, os.path.join(ROOT, "examples", name)] + list(args),
                 timeout=timeout)
    assert job.rc == 0, job.explain()
    return job


def row_value(out: str, label: str) -> float:
    """The number in the table row that starts with ``label``."""
    return float(re.search(r"\| %s[^|]*\| (-?[\d.]+) \|" % re.escape(label), out).group(1))


def test_allreduce_benchmark_prints_its_tables():
    job = example("allreduce_benchmark.py", "--reps", "5", "--max-mib", "1")
    rows = re.findall(r"\| (\d+ [KM]iB) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", job.out)
    assert [r[0] for r in rows] == ["1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB"], \
        job.explain()
    # Times are positive; the ratios are printed to 2 decimals, so under load
    # (tfhvd's call waiting on a busy core) raw/tfhvd can round to 0.00: check
    # it against the two times it is made of instead of against zero.
    for size, t_hvd, t_raw, ratio, paired in rows:
        assert float(t_hvd) > 0 and float(t_raw) > 0, (size, rows)
        assert abs(float(ratio) - float(t_raw) / float(t_hvd)) <= 0.006, (size, rows)
        assert float(paired) >= 0, (size, rows)
    assert "ratio 64 x 4 KiB / 1 x 256 KiB" in job.out
    assert "idle/off" in job.out


def test_allreduce_benchmark_eager_breakdown_adds_up_and_its_ceiling():
    """--eager-breakdown at the size --breakdown-kib sets: the four parts add up to
    the whole call (each is a difference of measured medians, printed to 0.1 us),
    and the ceiling row is transport / (transport + TensorFlow's dispatch of the
    reference op), so it lies in (0, 1)."""
    job = example("allreduce_benchmark.py", "--eager-breakdown", "--reps", "50",
                  "--breakdown-kib", "1024")
    assert "One eager 1 MiB allreduce, broken down" in job.out, job.explain()
    value = lambda label: row_value(job.out, label)  # noqa: E731
    total = value("hvd.allreduce(x, op=hvd.Sum)")
    parts = [value("= tfhvd's Python"), value("= TensorFlow's eager dispatch"),
             value("= tfhvd's runtime"), value("= the transport")]
    assert value("= the transport") > 0 and value("= TensorFlow's eager dispatch") > 0, job.out
    assert abs(sum(parts) - total) < 0.3, (parts, total, job.out)
    ceiling = value("raw/tfhvd ceiling")
    assert 0 < ceiling < 1 and 0 < value("raw/tfhvd measured"), job.out
    assert value("the reference op, called the same way") > 0, job.out


def test_graph_benchmark_floor_rows():
    """--floor: issue 13's rows beside the raw transport called from the step and
    TensorFlow's 64 more nodes, and the floor table built from them."""
    job = example("graph_benchmark.py", "--floor", "--reps", "10", "--skip-mlp", timeout=300)
    for row in ("1 x 1 KiB allreduce", "64 x 4 KiB allreduces", "1 x 256 KiB allreduce",
                "raw 1 KiB Allreduce in the step", "raw 256 KiB Allreduce in the step",
                "TensorFlow's 64 more nodes (64 adds over the plain twin)",
                "TensorFlow's 64 asynchronous nodes (64 TfhvdAsyncIdentity over the plain twin)"):
        assert re.search(r"\| %s \| [\d.]+ \| [\d.]+ \|" % re.escape(row), job.out), job.explain()
    assert "## The floor: what the same graph costs" in job.out, job.explain()
    # tfhvd's own 256 KiB row can fall below its twin's noise on a busy machine: "n/a".
    m = re.search(r"\| 64 x 4 KiB / 1 x 256 KiB \| (-?[\d.]+|n/a[^|]*) \| (-?[\d.]+|n/a[^|]*) "
                  r"\| <= 1.5 \|", job.out)
    assert m, job.explain()


def test_graph_benchmark_large_rows():
    job = example("graph_benchmark.py", "--large", "--reps", "8", "--skip-mlp", timeout=300)
    for size in ("256 KiB", "4 MiB", "16 MiB"):
        row = "1 x %s allreduce of a tensor the step produces" % size
        assert re.search(r"\| %s \| [\d.]+ \| [\d.]+ \|" % re.escape(row), job.out), job.explain()
    assert "64 x 4 KiB" not in job.out, job.explain()


def test_tensorflow_digits_trains():
    job = example("tensorflow_digits.py", "--epochs", "1")
    assert re.search(r"epoch 1\b.*loss", job.out, re.IGNORECASE), job.explain()


def test_keras_synthetic_benchmark_runs():
    job = example("keras_synthetic_benchmark.py", "--num-iters", "2",
                  "--num-batches-per-iter", "2", "--num-warmup-batches", "1")
    assert re.search(r"img/sec", job.out), job.explain()


def test_keras_mnist_trains_and_checkpoints(tmp_path):
    """The script `make demo` runs: 2 ranks, offline digits, tiny settings; rank 0
    prints its summary line and writes one checkpoint per epoch."""
    ckpt = tmp_path / "ckpt"
    job = example("keras_mnist.py", "--epochs", "2", "--batch-size", "64",
                  "--checkpoint-dir", str(ckpt))
    m = re.search(r"ranks: 2  steps/epoch/rank: (\d+)  final val_accuracy: ([\d.]+)", job.out)
    assert m and int(m.group(1)) > 0, job.explain()
    assert 0.0 <= float(m.group(2)) <= 1.0
    assert sorted(os.listdir(ckpt)) == ["checkpoint-1.keras", "checkpoint-2.keras"], job.explain()


def test_compare_builds_prints_both_builds_rows_and_rounds():
    """scripts/compare_builds.sh with this checkout as both builds, one run: each
    build's graph rows, and its negotiation rounds from graph_benchmark --probe-64."""
    from jobs import clean_env, run

    # Few repeats: the test checks what the script prints, not the timings.
    env = dict(clean_env(), GRAPH_BENCH_ARGS="--reps 20 --rounds 1 --skip-mlp")
    job = run(["bash", os.path.join(ROOT, "scripts", "compare_builds.sh"), ROOT, ROOT, "1"],
              timeout=400, env=env)
    assert job.rc == 0, job.explain()
    assert len(re.findall(r"^== run 1: ", job.out, re.M)) == 2, job.explain()
    # Each build's rows of examples/graph_benchmark.py in its default mode (the
    # script keeps these rows and the ratio line), numbers in both columns.
    for row in ("1 x 1 KiB allreduce", "64 x 4 KiB allreduces",
                "64 x 4 KiB allreduces, over a twin of 64 adds", "1 x 256 KiB allreduce"):
        assert len(re.findall(r"^\| %s \| [\d.]+ \| [\d.]+ \|" % re.escape(row), job.out,
                              re.M)) == 2, (row, job.explain())
    assert job.out.count("64 x 4 KiB over twin / 1 x 256 KiB over twin") == 2, job.explain()
    rounds = re.findall(r"rounds: (\d+), of all 64 tensors: (\d+); negotiation ([\d.]+|nan) us",
                        job.out)
    assert len(rounds) == 2 and all(int(r[0]) >= 300 for r in rounds), job.explain()
