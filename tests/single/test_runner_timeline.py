"""Timeline reading, the summary table and the PNG picture, on traces whose
numbers are known."""

import json
import string
import zlib

import numpy as np
import pytest

from tfhvd.runner import timeline_cli
from tfhvd.runner.timeline import TimelineError, format_table, load, parse, summarize
from tfhvd.runner.timeline_png import (_FONT, CHAR_W, PHASE_COLORS, decode_png, draw_text,
                                       encode_png, render)


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


def test_png_round_trip_and_crc():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, size=(17, 23, 3), dtype=np.uint8)
    data = encode_png(img)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.array_equal(decode_png(data), img)
    # IHDR: width, height, 8-bit RGB.
    assert data[16:24] == (23).to_bytes(4, "big") + (17).to_bytes(4, "big")
    assert data[24:26] == b"\x08\x02"
    broken = bytearray(data)
    broken[20] ^= 0xFF
    with pytest.raises(ValueError, match="bad CRC"):
        decode_png(bytes(broken))
    assert zlib.crc32(data[-8:-4]) & 0xFFFFFFFF == int.from_bytes(data[-4:], "big")
    with pytest.raises(ValueError):
        encode_png(img.astype(np.float32))


def test_font_covers_what_timelines_contain():
    for ch in string.ascii_letters + string.digits + "_-./:()[]=+%',#<>*? ":
        assert ch in _FONT, ch
        assert _FONT[ch].shape == (7, 5)
    img = np.full((20, 40, 3), 255, np.uint8)
    x = draw_text(img, 0, 0, "A~")  # unknown characters print as '?'
    assert x == 2 * CHAR_W
    assert (img != 255).any()


def test_render_places_bars_in_time():
    t = parse(trace_events())
    img = render(t, width=1000, title="test")
    blue = np.array(PHASE_COLORS["allreduce"], np.uint8)
    cols = np.where((img == blue).all(axis=2).any(axis=0))[0]
    assert cols.size, "no allreduce drawn"
    # Bars span from 100 us to 650 us of a 0-650 us window: the last blue
    # column is at the right edge of the plot, the first about 100/650 in.
    from tfhvd.runner.timeline_png import CHAR_W as cw
    plot_x0, plot_x1 = 30 * cw + 16, 1000 - 16
    expect_first = plot_x0 + 100 / 650 * (plot_x1 - plot_x0)
    assert abs(cols.min() - expect_first) <= 2
    assert abs(cols.max() - plot_x1) <= 2
    # A window shows only what falls in it.
    img2 = render(t, width=1000, start_ms=0.45, end_ms=0.7)
    neg = np.array(PHASE_COLORS["NEGOTIATE"], np.uint8)
    assert not (img2[:, 30 * cw + 16:] == neg).all(axis=2).any()
