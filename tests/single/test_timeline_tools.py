"""tfhvd.timeline: timeline reading, the summary table and the picture (drawn
with matplotlib, the optional 'timeline' extra, which make setup installs beside
the venv: conftest.timeline_deps), on traces whose numbers are known; and the
package's import rule."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import timeline_deps
from tfhvd.timeline import cli as timeline_cli
from tfhvd.timeline.analysis import TimelineError, format_table, load, parse, summarize
from tfhvd.timeline.layout import PHASE_COLORS
from tfhvd.timeline.picture import write_picture

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# matplotlib, after the venv's own packages.
sys.path.append(timeline_deps())


def trace_events(pid=0):
    """Rank `pid`: tensor 'g' (tid 1) negotiates 0-100 us and allreduces
    100-400 us (with 4096 bytes, a nested fusion copy); tensor 'h' (tid 2)
    allreduces twice, 50 us each; one cycle mark."""
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "rank %d" % pid}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "g"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 2, "args": {"name": "h"}},
        {"name": "QUEUE", "ph": "X", "ts": 0, "dur": 10, "pid": pid, "tid": 1},
        {"name": "NEGOTIATE_allreduce", "ph": "B", "ts": 0, "pid": pid, "tid": 1},
        {"ph": "E", "ts": 100, "pid": pid, "tid": 1},
        {"name": "allreduce", "ph": "B", "ts": 100, "pid": pid, "tid": 1,
         "args": {"bytes": 4096}},
        {"name": "MEMCPY_IN_FUSION_BUFFER", "ph": "B", "ts": 110, "pid": pid, "tid": 1},
        {"ph": "E", "ts": 130, "pid": pid, "tid": 1},
        {"ph": "E", "ts": 400, "pid": pid, "tid": 1},
        {"name": "allreduce", "ph": "B", "ts": 500, "pid": pid, "tid": 2,
         "args": {"bytes": 8}},
        {"ph": "E", "ts": 550, "pid": pid, "tid": 2},
        {"name": "allreduce", "ph": "B", "ts": 600, "pid": pid, "tid": 2,
         "args": {"bytes": 8}},
        {"ph": "E", "ts": 650, "pid": pid, "tid": 2},
        {"name": "CYCLE_START", "ph": "i", "s": "p", "ts": 5, "pid": pid, "tid": 0},
    ]


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_spans_rows_and_nesting():
    t = parse(trace_events())
    by = {(s.row, s.name): s for s in t.spans}
    assert by[("g", "allreduce")].duration == 300
    assert by[("g", "MEMCPY_IN_FUSION_BUFFER")].duration == 20
    assert by[("g", "QUEUE")].duration == 10
    assert by[("g", "allreduce")].args == {"bytes": 4096}
    assert t.processes == {0: "rank 0"}
    assert t.bounds() == (0, 650)
    assert not t.unfinished


def test_summary_numbers():
    stats = {s.name: s for s in summarize(parse(trace_events()))}
    ar = stats["allreduce"]
    assert (ar.count, ar.total, ar.max, ar.bytes) == (3, 400, 300, 4112)
    assert ar.mean == pytest.approx(400 / 3)
    assert stats["NEGOTIATE_allreduce"].count == 1 and stats["NEGOTIATE_allreduce"].bytes is None
    # Busiest first.
    assert summarize(parse(trace_events()))[0].name == "allreduce"


def test_table_text(tmp_path):
    t = load([write(tmp_path, "r0.json", trace_events(0)),
              write(tmp_path, "r1.json", {"traceEvents": trace_events(1)})])
    text = format_table(t, summarize(t))
    lines = text.splitlines()
    assert lines[0].split() == ["operation", "count", "total", "ms", "mean", "ms", "max", "ms",
                                "bytes"]
    ar = [x.split() for x in lines if x.startswith("allreduce ")][0]
    assert ar[:5] == ["allreduce", "6", "0.800", "0.133", "0.300"]
    assert ar[5:] == ["8.0", "KiB"]
    assert "2 ranks (0, 1), 4 tensor rows, 2 cycle marks" in text
    assert "not recorded" not in text


def test_unfinished_and_unterminated_files(tmp_path):
    evs = trace_events()[:7]  # the job died inside 'g's allreduce
    text = json.dumps(evs)
    path = write(tmp_path, "cut.json", text[:-1] + ",\n")  # Horovod leaves no ']'
    t = load([path])
    assert t.repaired == [path]
    stats = {s.name: s for s in summarize(t)}
    assert stats["allreduce"].unfinished == 1 and stats["allreduce"].count == 0
    out = format_table(t, summarize(t))
    assert "1 span never ended" in out and "allreduce of g on rank 0" in out
    assert "missing its closing ']'" in out
    with pytest.raises(TimelineError, match="not a JSON timeline"):
        load([write(tmp_path, "bad.json", "[{")])
    with pytest.raises(TimelineError, match="expected a JSON array"):
        load([write(tmp_path, "obj.json", {"x": 1})])


def test_bytes_column_says_when_not_recorded():
    evs = [e for e in trace_events() if "args" not in e or e.get("ph") == "M"]
    t = parse(evs)
    assert "bytes: not recorded" in format_table(t, summarize(t))


def test_cli_summarize_json(tmp_path, capsys):
    path = write(tmp_path, "t.json", trace_events())
    assert timeline_cli.main(["summarize", "--json", path]) == 0
    data = {d["operation"]: d for d in json.loads(capsys.readouterr().out)}
    assert data["allreduce"]["count"] == 3 and data["allreduce"]["bytes"] == 4112
    assert timeline_cli.main(["summarize", str(tmp_path / "none.json")]) == 1
    assert "cannot read it" in capsys.readouterr().err


@pytest.fixture
def no_matplotlib(monkeypatch):
    """As on a machine without matplotlib: importing it fails."""
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_without_matplotlib_the_picture_says_how_to_install_it(tmp_path, capsys,
                                                              no_matplotlib):
    t = parse(trace_events())
    with pytest.raises(ImportError, match=r"needs matplotlib \(pip install \"\./tfhvd\[timeline\]"):
        write_picture(t, str(tmp_path / "t.png"))
    assert not (tmp_path / "t.png").exists()
    path = write(tmp_path, "t.json", trace_events())
    assert timeline_cli.main(["render", path, "-o", str(tmp_path / "t.png")]) == 1
    assert "tfhvd[timeline]" in capsys.readouterr().err
    # The summary needs nothing.
    assert timeline_cli.main(["summarize", path]) == 0
    assert "allreduce" in capsys.readouterr().out


def test_cli_render(tmp_path, capsys):
    from matplotlib.image import imread

    path = write(tmp_path, "t.json", trace_events())
    out = str(tmp_path / "t.png")
    assert timeline_cli.main(["render", path, "-o", out, "--width", "800"]) == 0
    assert "wrote %s (800x" % out in capsys.readouterr().out
    assert imread(out).shape[1] == 800
    empty = write(tmp_path, "e.json", [])
    assert timeline_cli.main(["render", empty, "-o", out]) == 1
    assert "nothing to draw" in capsys.readouterr().err


def test_picture_places_bars_in_time(tmp_path):
    from matplotlib.image import imread

    t = parse(trace_events(0) + trace_events(1))
    pic = write_picture(t, str(tmp_path / "m.png"), width=1000, title="test")
    data = (tmp_path / "m.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = (imread(str(tmp_path / "m.png"))[:, :, :3] * 255).round().astype(np.uint8)
    assert img.shape[:2] == (pic.height, pic.width) and pic.width == 1000
    for phase in ("allreduce", "NEGOTIATE"):
        color = np.array(PHASE_COLORS[phase], np.uint8)
        assert (np.abs(img.astype(int) - color).max(axis=2) <= 1).any(), phase
    # Bars are placed in time: allreduce from 0.1 ms to 0.65 ms of the 0.65 ms trace.
    blue = (np.abs(img.astype(int) - np.array(PHASE_COLORS["allreduce"])).max(axis=2) <= 1)
    cols = np.where(blue.any(axis=0))[0]
    plot_x0, plot_x1 = 260, 1000 - 20
    assert abs(cols.min() - (plot_x0 + 100 / 650 * (plot_x1 - plot_x0))) <= 3
    assert abs(cols.max() - plot_x1) <= 3
    # A window shows only what falls in it: no negotiation after 0.45 ms.
    pic = write_picture(t, str(tmp_path / "w.png"), width=1000, start_ms=0.45, end_ms=0.7)
    img = (imread(str(tmp_path / "w.png"))[:, :, :3] * 255).round().astype(np.uint8)
    neg = np.abs(img.astype(int) - np.array(PHASE_COLORS["NEGOTIATE"])).max(axis=2) <= 1
    assert not neg[:, plot_x0:].any()


def test_import_loads_no_runner_or_framework_module():
    """tfhvd.timeline is a users' tool: importing it (and its modules) starts
    nothing of the launcher or the frameworks (the design's import rules)."""
    code = ("import sys, tfhvd.timeline, tfhvd.timeline.cli, tfhvd.timeline.picture; "
            "from tfhvd.timeline import load, write_picture; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('tfhvd', "
            "'tensorflow', 'keras')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert "tfhvd.timeline.picture" in out
    assert not [m for m in out if m.startswith(("tfhvd.runner", "tfhvd.tensorflow",
                                                "tfhvd._keras", "tfhvd.keras", "tensorflow",
                                                "keras"))], out
    # The package alone, and the summary command, import nothing heavy.
    code = ("import sys, tfhvd.timeline.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('tfhvd', 'numpy'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "numpy" not in out and "tfhvd.runner" not in out, out


def test_timeline_package_names_only_itself_and_common():
    """The same rule on the sources, lazy (function-level) imports included:
    tfhvd.timeline names no tfhvd module but its own and tfhvd.common."""
    from test_import_cycles import import_graph

    graph = import_graph(ROOT, "tfhvd")
    mine = {m: ts for m, ts in graph.items() if m == "tfhvd.timeline"
            or m.startswith("tfhvd.timeline.")}
    assert {"tfhvd.timeline.cli", "tfhvd.timeline.layout", "tfhvd.timeline.picture"} <= set(mine)
    bad = ["%s -> %s" % (m, t) for m, ts in sorted(mine.items()) for t in sorted(ts)
           if not t.startswith(("tfhvd.timeline", "tfhvd.common")) and t != "tfhvd.version"]
    assert not bad, bad
