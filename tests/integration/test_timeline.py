"""The timeline, from real jobs: the three ways to start it, valid JSON even
after a crash, one file per rank, its phases, and tfhvd-timeline.

Files and phases the runtime writes (tfhvd_ops/core/timeline.cc): only rank
0 writes a plain path (Horovod's habit); ``{rank}`` in the path gives every
rank its own file.  Every tensor row has QUEUE, NEGOTIATE_<op> and <op>
spans (fused allreduces also MEMCPY_IN_FUSION_BUFFER and
MEMCPY_OUT_FUSION_BUFFER); collective spans carry ``args.bytes``.
"""

import json
import os
import sys

import numpy as np

from jobs import TRAIN, clean_env, launch, run, tfhvd_timeline, train


def events(path):
    with open(path) as f:
        return json.load(f)  # strict: the file must be valid JSON as it is


def names(evs, ph="B"):
    return {e.get("name") for e in evs if e.get("ph") == ph}


def rows(evs):
    return {e["args"]["name"] for e in evs if e.get("name") == "thread_name"}


def test_timeline_from_the_environment(tmp_path):
    path = tmp_path / "env.json"
    job = train(1, "--steps", "3", env=clean_env({"TFHVD_TIMELINE": str(path)}))
    assert job.rc == 0, job.explain()
    evs = events(path)
    assert {"NEGOTIATE_allreduce", "allreduce", "NEGOTIATE_broadcast", "broadcast"} <= names(evs)
    assert {"loss_0", "loss_1", "loss_2"} <= rows(evs)
    assert any(e.get("name") == "process_name" and e["pid"] == 0 for e in evs)
    # Every B has its E on the same row.
    opened = {}
    for e in evs:
        if e["ph"] in "BE":
            opened[(e["pid"], e["tid"])] = opened.get((e["pid"], e["tid"]), 0) + (
                1 if e["ph"] == "B" else -1)
    assert set(opened.values()) == {0}, opened


def test_horovod_timeline_variable_and_mark_cycles(tmp_path):
    path = tmp_path / "hvd.json"
    job = train(1, "--steps", "2", env=clean_env({"HOROVOD_TIMELINE": str(path),
                                                  "HOROVOD_TIMELINE_MARK_CYCLES": "1"}))
    assert job.rc == 0, job.explain()
    evs = events(path)
    assert "allreduce" in names(evs)
    assert any(e.get("name") == "CYCLE_START" and e["ph"] == "i" for e in evs)


def test_start_and_stop_timeline_from_python(tmp_path):
    path = tmp_path / "api.json"
    job = train(1, "--steps", "2", "--timeline", str(path), "--mark-cycles")
    assert job.rc == 0, job.explain()
    evs = events(path)
    assert "allreduce" in names(evs) and "CYCLE_START" in names(evs, "i")
    # Started after broadcast_variables? No: right after init, so it has it.
    assert "broadcast" in names(evs)


def test_timeline_is_valid_json_after_a_crash(tmp_path):
    path = tmp_path / "crash.json"
    job = train(1, "--steps", "6", "--fail-rank", "0", "--fail-step", "3", "--fail-mode",
                "kill", env=clean_env({"TFHVD_TIMELINE": str(path)}))
    assert job.rc != 0 and "injecting" in job.out, job.explain()
    evs = events(path)  # no repair needed
    assert {"loss_0", "loss_1", "loss_2"} <= rows(evs)
    summary = run(tfhvd_timeline() + ["summarize", str(path)], timeout=60)
    assert summary.rc == 0 and "closing" not in summary.out, summary.explain()


def test_rank_placeholder_gives_each_rank_its_own_file(tmp_path):
    job = train(2, "--steps", "3", launcher_args=[
        "--timeline-filename", str(tmp_path / "tl.{rank}.json"), "--timeline-mark-cycles"])
    assert job.rc == 0, job.explain()
    rank0, rank1 = events(tmp_path / "tl.0.json"), events(tmp_path / "tl.1.json")
    assert {e["pid"] for e in rank0 if "pid" in e} == {0}
    assert {e["pid"] for e in rank1 if "pid" in e} == {1}
    for evs in (rank0, rank1):
        assert {"loss_0", "loss_1", "loss_2"} <= rows(evs)
        assert "CYCLE_START" in names(evs, "i")
    # Both files merge into one summary.
    table = run(tfhvd_timeline() + ["summarize", str(tmp_path / "tl.0.json"),
                                    str(tmp_path / "tl.1.json")], timeout=60)
    assert "2 ranks (0, 1)" in table.out, table.explain()


def test_plain_path_is_written_by_rank_0_only(tmp_path):
    path = tmp_path / "tl.json"
    job = train(2, "--steps", "2", launcher_args=["--timeline-filename", str(path)])
    assert job.rc == 0, job.explain()
    assert {e["pid"] for e in events(path) if "pid" in e} == {0}
    assert sorted(os.listdir(tmp_path)) == ["tl.json"]


def test_rows_have_queue_fusion_and_byte_counts(tmp_path):
    path = tmp_path / "phases.json"
    # Two ranks so the gradients are really allreduced (and fused: 3 tensors).
    job = train(2, "--steps", "2", env=clean_env({"TFHVD_TIMELINE": str(path)}))
    assert job.rc == 0, job.explain()
    evs = events(path)
    phases = names(evs) | names(evs, "X")
    assert {"QUEUE", "NEGOTIATE_allreduce", "allreduce", "MEMCPY_IN_FUSION_BUFFER",
            "MEMCPY_OUT_FUSION_BUFFER"} <= phases, phases
    sizes = [e["args"]["bytes"] for e in evs if e.get("name") == "allreduce" and e["ph"] == "B"]
    assert sizes and all(isinstance(b, int) for b in sizes)
    # w1 is 8x16 float64: 1024 bytes.
    assert 8 * 16 * 8 in sizes, sizes
    table = run(tfhvd_timeline() + ["summarize", str(path)], timeout=60)
    line = [x for x in table.out.splitlines() if x.startswith("allreduce ")][0]
    assert not line.rstrip().endswith("-"), table.out


def test_summarize_and_render_a_real_timeline(tmp_path):
    path = tmp_path / "real.json"
    job = train(1, "--steps", "4", env=clean_env({"TFHVD_TIMELINE": str(path)}))
    assert job.rc == 0, job.explain()
    evs = events(path)
    n_allreduce = sum(1 for e in evs if e.get("name") == "allreduce" and e["ph"] == "B")
    out = run(tfhvd_timeline() + ["summarize", str(path)], timeout=60)
    assert out.rc == 0, out.explain()
    header, rule = out.out.splitlines()[:2]
    assert header.split() == ["operation", "count", "total", "ms", "mean", "ms", "max", "ms",
                              "bytes"]
    row = [x.split() for x in out.out.splitlines() if x.startswith("allreduce ")][0]
    assert int(row[1]) == n_allreduce
    js = run(tfhvd_timeline() + ["summarize", "--json", str(path)], timeout=60)
    data = {d["operation"]: d for d in json.loads(js.out)}
    assert data["allreduce"]["count"] == n_allreduce
    assert abs(data["allreduce"]["mean_ms"] * n_allreduce - data["allreduce"]["total_ms"]) < 1e-6

    # The picture (matplotlib, the timeline extra, beside the venv:
    # conftest.timeline_deps), read back: bars of the allreduce colour in a PNG
    # of the asked width.
    from conftest import timeline_deps

    sys.path.append(timeline_deps())
    from matplotlib.image import imread

    from tfhvd.timeline.layout import PHASE_COLORS

    png = tmp_path / "real.png"
    out = run(tfhvd_timeline() + ["render", str(path), "-o", str(png)], timeout=120,
              env=clean_env({"PYTHONPATH": timeline_deps()}))
    assert out.rc == 0, out.explain()
    img = (imread(str(png))[:, :, :3] * 255).round().astype(int)
    assert img.shape[1] == 1400
    blue = np.abs(img - np.array(PHASE_COLORS["allreduce"])).max(axis=2) <= 1
    assert blue.sum() > 0, "no allreduce bar drawn"


def test_timeline_cli_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = run(tfhvd_timeline() + ["summarize", str(bad)], timeout=60)
    assert out.rc == 1 and "not a JSON timeline" in out.err
    out = run(tfhvd_timeline() + ["summarize", str(tmp_path / "missing.json")], timeout=60)
    assert out.rc == 1 and "cannot read it" in out.err


def test_timeline_filename_flag_single_rank(tmp_path):
    path = tmp_path / "flag.json"
    job = launch(["-np", "1", "--timeline-filename", str(path), sys.executable, TRAIN,
                  "--steps", "2"])
    assert job.rc == 0, job.explain()
    assert "allreduce" in names(events(path))
    assert os.path.getsize(path) > 0
