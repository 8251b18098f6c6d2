"""Process sets as whole jobs: static sets given to init (lists of ranks and
mpi4py communicators), the errors of init and of a job without dynamic mode,
and the ProcessSet object without a runtime."""

import pytest

import tfhvd.tensorflow as hvd
from tests.single.test_mpirun_jobs import MPIRUN, mpirun

needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")


def test_process_set_object_without_runtime():
    ps = hvd.ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and ps.process_set_id is None
    assert str(ps) == "ProcessSet(process_set_id=None, ranks=[0, 2], mpi_comm=None)"
    assert ps.size() is None and ps.rank() is None and ps.included() is None
    for bad in (["a"], 42, [1.5]):
        with pytest.raises(ValueError, match="either integer ranks or an mpi4py communicator"):
            hvd.ProcessSet(bad)
    with pytest.raises(ValueError, match="dynamic"):
        hvd.init(process_sets="static")
    with pytest.raises(TypeError, match="hvd.ProcessSet"):
        hvd.init(process_sets=[[0, 1]])


@needs_mpirun
def test_static_sets_from_ranks_and_communicators():
    out = mpirun(3, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        from mpi4py import MPI
        w = MPI.COMM_WORLD
        r = w.rank
        ends = hvd.ProcessSet([2, 0])
        halves = hvd.ProcessSet(w.Split(r // 2))            # [0, 1] on 0 and 1, [2] on 2
        tail = hvd.ProcessSet(w.Create_group(w.group.Incl([1, 2])))  # COMM_NULL on 0
        hvd.init(process_sets=[ends, halves, tail])
        say(r, "ranks", ends.ranks, halves.ranks, tail.ranks)
        ids = hvd.allgather_object((ends.process_set_id, tail.process_set_id))
        say(r, "ids agree", len(set(ids)) == 1)
        for name, ps in (("ends", ends), ("halves", halves), ("tail", tail)):
            if ps.included():
                v = hvd.allreduce(tf.constant(float(r)), op=hvd.Sum, name="v", process_set=ps)
                say(r, name, ps.size(), ps.rank(), float(v))
        try:
            hvd.add_process_set([1])
        except ValueError as e:
            say(r, "add refused", "HOROVOD_DYNAMIC_PROCESS_SETS=1" in str(e))
        try:
            hvd.remove_process_set(ends)
        except ValueError as e:
            say(r, "remove refused", "DYNAMIC_PROCESS_SETS" in str(e))
        say(r, "global", float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)))
    """)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "0 ranks [0, 2] [0, 1] [1, 2]" in text
    assert "1 ranks [0, 2] [0, 1] [1, 2]" in text
    assert "2 ranks [0, 2] [2] [1, 2]" in text
    assert text.count("ids agree True") == 3
    for line in ("0 ends 2 0 2.0", "2 ends 2 1 2.0", "0 halves 2 0 1.0", "1 halves 2 1 1.0",
                 "2 halves 1 0 2.0", "1 tail 2 0 3.0", "2 tail 2 1 3.0"):
        assert line in text, line
    assert text.count("add refused True") == 3 and text.count("remove refused True") == 3
    assert text.count("global 3.0") == 3


@needs_mpirun
def test_duplicate_set_in_init_and_horovod_env():
    out = mpirun(2, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        a, b, c = hvd.ProcessSet([0]), hvd.ProcessSet([1]), hvd.ProcessSet([0])
        try:
            hvd.init(process_sets=[a, b, c])
        except ValueError as e:
            say(hvd.rank(), "init refused", "entry number 2 is a duplicate" in str(e))
        old = b.process_set_id
        say(hvd.rank(), "removed", hvd.remove_process_set(b))
        ps = hvd.add_process_set([1])
        say(hvd.rank(), "added", ps.ranks, ps.size(), ps.process_set_id > old)
        say(hvd.rank(), "global", float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)))
        r = hvd.rank()
        hvd.shutdown()  # its sets are gone: a later init numbers from 1 again
        say(r, "invalidated", ps.process_set_id, a.process_set_id)
    """, env={"HOROVOD_DYNAMIC_PROCESS_SETS": "1"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("init refused True") == 2
    assert text.count("removed True") == 2
    assert text.count("added [1] 1 True") == 2
    assert text.count("global 2.0") == 2
    assert text.count("invalidated None None") == 2


@needs_mpirun
def test_a_process_set_is_checked_once_on_the_way_to_the_op():
    """hvd.allreduce and hvd.grouped_allreduce look a process set up once (where
    the op is built), not again in the tape layer; a bad set still fails."""
    out = mpirun(2, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        from tfhvd.common import process_sets as P
        ps = hvd.ProcessSet([0])
        hvd.init(process_sets=[ps])
        if hvd.rank() == 0:
            calls, lookup = [0], P.process_set_id
            def counting(x):
                calls[0] += 1
                return lookup(x)
            P.process_set_id = counting
            hvd.allreduce(tf.ones([2]), op=hvd.Sum, process_set=ps)
            one = calls[0]
            hvd.grouped_allreduce([tf.ones([2]), tf.ones([3])], process_set=ps)
            say("lookups", one, calls[0] - one)
            try:
                hvd.grouped_allreduce([], process_set=hvd.ProcessSet([0, 1, 2]))
            except ValueError as e:
                say("refused", "not registered" in str(e) or "process set" in str(e))
        hvd.barrier()
    """)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "lookups 1 1" in text
    assert "refused True" in text
