"""Reading mpirun's output: per-rank line reassembly, naming the failing
rank, and the result lines of tfhvd.run()."""

import pytest

from tfhvd.runner import task
from tfhvd.runner.api import RunError, _Collector, _results
from tfhvd.runner.output import Demux, FailureTracker, Line


def feed_all(raw: str, stream: str = "stderr"):
    d = Demux(stream)
    lines = []
    for part in raw.splitlines(keepends=True):
        lines += d.feed(part)
    return lines + d.flush()


def test_demux_reassembles_lines_split_across_ranks():
    raw = ("[1,0]<stdout>:0[1,1]<stdout>:1 vm 1.0\n"
           "[1,0]<stdout>: [1,0]<stdout>:vm[1,0]<stdout>: [1,0]<stdout>:1.0[1,0]<stdout>:\n")
    lines = feed_all(raw, "stdout")
    assert [(x.rank, x.text) for x in lines] == [(1, "1 vm 1.0"), (0, "0 vm 1.0")]
    assert lines[1].render() == "[1,0]<stdout>:0 vm 1.0\n"


def test_demux_keeps_mpiruns_own_lines_and_blank_lines():
    lines = feed_all("-----\n\n[1,2]<stderr>:x\nPrimary job terminated\n")
    assert [(x.rank, x.text) for x in lines] == [
        (None, "-----"), (None, ""), (2, "x"), (None, "Primary job terminated")]
    assert lines[0].render() == "-----\n"


def test_demux_flushes_a_last_line_without_newline():
    d = Demux("stdout")
    assert d.feed("[1,0]<stdout>:partial") == []
    assert [(x.rank, x.text) for x in d.flush()] == [(0, "partial")]


def tracked(text: str) -> FailureTracker:
    t = FailureTracker()
    for line in feed_all(text):
        t.feed(line)
    return t


RAISE = """\
[1,1]<stderr>:Traceback (most recent call last):
[1,1]<stderr>:  File "train.py", line 10, in <module>
[1,1]<stderr>:    [1,1]<stderr>:raise RuntimeError("boom")[1,1]<stderr>:
[1,1]<stderr>:RuntimeError[1,1]<stderr>:: [1,1]<stderr>:boom on rank 1[1,1]<stderr>:
[1,0]<stderr>:Traceback (most recent call last):
[1,0]<stderr>:  File "train.py", line 13, in <module>
[1,0]<stderr>:tensorflow.python.framework.errors_impl.AbortedError: {{function_node __wrapped__X}} \
tfhvd: allreduce of tensor 'grad' cannot complete: ranks [1] have shut down [Op:HorovodAllreduce] \
name: grad
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[30687,1],0]
  Exit code:    1
"""


def test_the_rank_that_raised_is_named_not_the_first_to_exit():
    t = tracked(RAISE)
    assert t.culprit() == ([1], "raised RuntimeError: boom on rank 1")
    s = t.summary(1)
    assert "tfhvdrun: the job failed (exit code 1)." in s
    assert "tfhvdrun: rank 1 raised RuntimeError: boom on rank 1." in s
    # The victim is listed, without TensorFlow's wrapping.
    assert ("tfhvdrun: rank 0 then failed: tensorflow.python.framework.errors_impl.AbortedError:"
            " tfhvd: allreduce of tensor 'grad' cannot complete: ranks [1] have shut down") in s
    assert "function_node" not in s and "[Op:" not in s


def test_a_consequence_arriving_first_does_not_hide_the_cause():
    lines = RAISE.splitlines(keepends=True)
    victim = lines[4:7]
    t = tracked("".join(victim + lines[:4]))
    assert t.culprit()[0] == [1]


def test_stdout_between_traceback_lines_is_not_the_error():
    # stdout and stderr are read by two threads: a stdout line can arrive
    # while a traceback is still coming in on stderr.
    t = FailureTracker()
    t.feed(Line(1, "stderr", "Traceback (most recent call last):"))
    t.feed(Line(1, "stdout", "rank 1: injecting 'raise' at step 3"))
    t.feed(Line(1, "stderr", '  File "train.py", line 70, in main'))
    t.feed(Line(1, "stderr", "RuntimeError: injected"))
    assert t.culprit() == ([1], "raised RuntimeError: injected")


def test_an_error_inside_a_tf_function_is_named_by_its_own_message():
    """AutoGraph's exception line is only "TypeError: in user code:"; the
    original "Name: message" is the indented block's last such line.  A
    consequence reported that way is still a consequence."""
    t = FailureTracker()
    for text in ["Traceback (most recent call last):", '  File "train.py", line 10, in <module>',
                 "    step()", "TypeError: in user code:", "",
                 '    File "train.py", line 9, in step  *',
                 "        hvd.broadcast_variables(opt.variables(), root_rank=0)", "",
                 "    TypeError: 'list' object is not callable", ""]:
        t.feed(Line(1, "stderr", text))
    for text in ["Traceback (most recent call last):", "ValueError: in user code:",
                 '    File "train.py", line 9, in step  *',
                 "    tensorflow.python.framework.errors_impl.AbortedError: allreduce of "
                 "tensor 'g' cannot complete: ranks [1] have shut down"]:
        t.feed(Line(0, "stderr", text))
    t.feed(Line(0, "stderr", "tfhvd: a later line at column 0 ends the block"))
    t.feed(Line(0, "stderr", "    KeyError: 'not part of the block'"))
    assert t.culprit() == ([1], "raised TypeError: 'list' object is not callable "
                                "(in a tf.function)")
    assert "rank 0 then failed: tensorflow.python.framework.errors_impl.AbortedError: " \
        "allreduce of tensor 'g'" in t.summary(1)
    assert "KeyError" not in t.summary(1)


def test_a_graph_execution_error_is_named_by_the_kernels_message():
    """TF1 sessions and tf.function runs say "Graph execution error:", then where
    the node was defined, "Node: 'name'", then the kernel's message: that
    message names the error (here a consequence of rank 1 leaving)."""
    t = FailureTracker()
    for text in ["Traceback (most recent call last):", '  File "train.py", line 8, in <module>',
                 "tensorflow.python.framework.errors_impl.UnknownError: Graph execution error:",
                 "", "Detected at node 'grad' defined at (most recent call last):",
                 '    File "train.py", line 4, in <module>', "Node: 'grad'",
                 "tfhvd: allreduce of tensor 'grad' cannot complete: ranks [1] have shut down",
                 "\t [[{{node grad}}]]", "", "Original stack trace for 'grad':"]:
        t.feed(Line(0, "stderr", text))
    # The same error again, as the chained traceback of a session shows it.
    t.feed(Line(0, "stderr", "Traceback (most recent call last):"))
    t.feed(Line(0, "stderr", "tensorflow.python.framework.errors_impl.UnknownError: tfhvd: "
                             "allreduce of tensor 'grad' cannot complete: ranks [1] have shut down"))
    t.record_exit(1, 0, "h")
    message = ("tensorflow.python.framework.errors_impl.UnknownError: tfhvd: allreduce of tensor "
               "'grad' cannot complete: ranks [1] have shut down")
    assert t.culprit() == ([1], "stopped taking part: rank 0 reported " + message)
    assert t.summary(1).count("rank 0 then failed: " + message) == 1, t.summary(1)


def test_mpirun_message_splitting_a_traceback_line():
    # mpirun's own message lands between a traceback line's indentation and
    # its text: "main()" then stands at column 0 but is not the exception.
    t = tracked(
        "[1,0]<stderr>:[tfhvd ERROR rank 0] rank 1 exited or lost its connection\n"
        "[1,0]<stderr>:Traceback (most recent call last):\n"
        '[1,0]<stderr>:  File "train.py", line 112, in <module>\n'
        "[1,0]<stderr>:    -----------------------------------------------\n"
        "[1,0]<stderr>:main()\n"
        '[1,0]<stderr>:  File "train.py", line 88, in main\n'
        "[1,0]<stderr>:tensorflow.python.framework.errors_impl.AbortedError: tfhvd: allreduce "
        "of tensor 'g' cannot complete: ranks [1] have exited or lost their connection\n")
    assert t.culprit()[0] == [1], t.summary(1)
    assert "raised main()" not in t.summary(1)


def test_killed_rank():
    t = tracked("--------\nmpirun noticed that process rank 1 with PID 0 on node vm exited on "
                "signal 9 (Killed).\n--------\n")
    assert t.culprit() == ([1], "was killed by signal 9 (Killed) on vm")


def test_rank_exiting_improperly_across_wrapped_lines():
    t = tracked("mpirun has exited due to process rank 2 with PID 77 on\n"
                "node hostB exiting improperly. There are three reasons this could occur:\n")
    assert t.culprit() == ([2], "exited without finalizing on hostB")


def test_stall_shutdown_names_the_missing_ranks():
    t = tracked(
        "[1,0]<stderr>:[tfhvd WARNING rank 0] stall: some ranks submitted these collectives\n"
        "[1,0]<stderr>:  'loss_3' waited 4 s; missing ranks [1]\n"
        "[1,0]<stderr>:Traceback (most recent call last):\n"
        "[1,0]<stderr>:tensorflow.python.framework.errors_impl.InvalidArgumentError: tfhvd: "
        "'loss_3' stalled for over 5 s: ranks [1] never submitted it\n")
    ranks, why = t.culprit()
    assert ranks == [1] and why.startswith("stopped taking part: rank 0 reported")
    assert t.stalls() == {"loss_3": (4, "1")}
    assert "stalled collective 'loss_3': ranks [1] missing after 4 s" in t.summary(1)


def test_coordinator_gone_points_at_rank_0():
    t = tracked("[1,1]<stderr>:Traceback (most recent call last):\n"
                "[1,1]<stderr>:tensorflow.python.framework.errors_impl.AbortedError: tfhvd: "
                "the coordinator (rank 0) has shut down; this collective cannot complete\n")
    assert t.culprit()[0] == [0]


def test_chained_tracebacks_and_fallbacks():
    t = tracked("[1,3]<stderr>:Traceback (most recent call last):\n"
                "[1,3]<stderr>:KeyError: 'x'\n"
                "[1,3]<stderr>:\n"
                "[1,3]<stderr>:During handling of the above exception, another exception "
                "occurred:\n"
                "[1,3]<stderr>:Traceback (most recent call last):\n"
                "[1,3]<stderr>:ValueError: y\n")
    assert t.culprit() == ([3], "raised KeyError: 'x'")
    t = tracked("  Process name: [[5,1],2]\n  Exit code:    7\n")
    assert t.culprit() == ([2], "exited with code 7 first")
    assert FailureTracker().culprit() is None
    assert FailureTracker().summary(4) == "tfhvdrun: the job failed (exit code 4)."


def result_feed(collector, rank, ok, value, interleave=()):
    for text in task.result_lines(rank, ok, value):
        assert collector(Line(rank, "stdout", text.rstrip("\n"), "[1,%d]<stdout>:" % rank))
        for other in interleave:
            collector(other)


def test_results_travel_in_chunks_and_are_swallowed():
    c = _Collector()
    big = list(range(20000))  # several chunks
    noise = Line(1, "stdout", "ordinary output", "[1,1]<stdout>:")
    assert not c(noise) and not c(Line(None, "stdout", task.RESULT_MARKER))
    result_feed(c, 0, True, big, interleave=[noise])
    result_feed(c, 1, True, {"a": 1})
    assert c.result(0) == (True, big) and c.result(1) == (True, {"a": 1})
    assert _results(c, FailureTracker(), 2, 0) == [big, {"a": 1}]


def test_a_corrupt_or_missing_result_is_an_error():
    c = _Collector()
    lines = task.result_lines(0, True, "x" * 10000)
    for text in lines[:-1]:
        c(Line(0, "stdout", text.rstrip("\n")))
    assert c.result(0) is None  # a chunk is missing
    with pytest.raises(RunError, match="rank 0 sent no result"):
        _results(c, FailureTracker(), 1, 137)
    rank, ok, idx, count, crc, chunk = task.parse_line(lines[-1].rstrip("\n"))
    c(Line(0, "stdout", "%s 0 ok %d %d %08x %s" % (task.RESULT_MARKER, idx, count, crc,
                                                  chunk[::-1])))
    assert c.result(0) is None  # the CRC catches the damage


def test_failures_report_the_first_failing_rank():
    c = _Collector()
    result_feed(c, 0, False, {"type": "AbortedError", "message": "ranks [1] have shut down",
                              "traceback": "tb0"})
    result_feed(c, 1, False, {"type": "ValueError", "message": "bad", "traceback": "tb1"})
    t = FailureTracker()
    for line in feed_all("[1,1]<stderr>:Traceback (most recent call last):\n"
                         "[1,1]<stderr>:ValueError: bad\n"):
        t.feed(line)
    with pytest.raises(RunError, match="rank 1 raised ValueError: bad") as e:
        _results(c, t, 2, 1)
    assert e.value.rank == 1 and e.value.remote_traceback == "tb1" and e.value.exit_code == 1
