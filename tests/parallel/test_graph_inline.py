"""Graph ops that run tfhvd's loop on their own executor thread (TFHVD_GRAPH_INLINE).

A graph op that was alone in its last negotiation round runs the loop itself
instead of waking the background thread (docs/PERFORMANCE.md, "Graph mode"); a
burst of ungrouped ops is left to the background thread, which negotiates it
while it is still being enqueued.  These tests count the inline runs
(``tfhvd.common.basics.graph_inline_runs``) and check every result.
"""

import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.common import basics, process_sets


def _inline_enabled() -> bool:
    return basics.settings()["graph_inline"] == "1"


def _may_run_inline() -> bool:
    """Rank 0, the coordinator of every process set, keeps its background thread
    on the control channel while other process sets exist (their members need
    answers while rank 0 has nothing of its own), so there only that thread runs
    the loop."""
    return _inline_enabled() and (hvd.rank() != 0 or len(process_sets._ids()) == 1)


def test_a_lone_graph_op_runs_the_loop_on_its_own_thread():
    size = hvd.size()

    @tf.function(autograph=False)
    def lone(t):
        return hvd.allreduce(t, op=hvd.Sum, name="inline_lone")

    x = tf.fill([256], float(hvd.rank() + 1))
    want = [float(size * (size + 1) // 2)] * 256
    for _ in range(3):  # traced, then negotiated alone: remembered as such
        lone(x)
    before = basics.graph_inline_runs()
    # A call finds the loop busy when the background thread still holds it (its
    # look at the channel every 100 ms, or a peer's request that came first):
    # most find it free at np 2 (38 of 40 here), from none of 60 to half at np 3
    # on 2 loaded cores.  So the ranks call in rounds of 60, up to 10 rounds,
    # until every rank that may run inline has seen 3 inline runs; they agree
    # on another round with a Max allreduce, so all call equally often.
    # Without the feature: none in 600 calls.
    runs = 0
    for round_ in range(10):
        for _ in range(60):
            assert lone(x).numpy().tolist() == want
        runs = basics.graph_inline_runs() - before
        need = int(_may_run_inline() and runs < 3)
        more = hvd.allreduce(tf.constant(need), op=hvd.Max, name="inline_more_%d" % round_)
        if int(more.numpy()) == 0:
            break
    if not _inline_enabled():
        assert runs == 0
    elif _may_run_inline():
        assert runs >= 3, runs


def test_a_burst_of_graph_ops_is_not_run_one_by_one():
    """Eight ungrouped allreduces in one function, each first negotiated alone
    (in functions of their own).  Were each to run the loop itself, each would
    wait for its predecessor's round, and be remembered as alone again: eight
    rounds a call, for ever.  An op that follows its thread's inline run within
    microseconds marks a burst, which goes to the background thread."""
    size = hvd.size()

    def one(i):
        return tf.function(lambda t: hvd.allreduce(t * float(i), op=hvd.Sum,
                                                   name="inline_burst_%d" % i), autograph=False)

    lones = [one(i) for i in range(8)]

    @tf.function(autograph=False)
    def burst(t):
        return [hvd.allreduce(t * float(i), op=hvd.Sum, name="inline_burst_%d" % i)
                for i in range(8)]

    x = tf.ones([64])
    want = [[float(i * size)] * 64 for i in range(8)]
    burst(x)  # traced
    calls = 30
    runs = []
    for _ in range(calls):
        for _ in range(2):
            for f in lones:
                f(x)
        before = basics.graph_inline_runs()
        assert [o.numpy().tolist() for o in burst(x)] == want
        runs.append(basics.graph_inline_runs() - before)
    # A typical call runs the loop inline once: for the burst's first op,
    # which cannot know that seven follow it.  A busy machine may delay an op
    # past the burst gap now and then (a call with two), so the median is
    # what is checked: without burst detection it is two or more.
    assert sorted(runs)[calls // 2] <= 1, runs
