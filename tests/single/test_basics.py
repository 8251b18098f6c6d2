"""One-process tests: a job of size 1, settings, error messages, build info."""

import os
import textwrap
from typing import Dict

import numpy as np
import pytest
import tensorflow as tf

import tfhvd
import tfhvd.tensorflow as hvd
from tests.conftest import run_python


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield


def test_size_one_topology():
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (0, 1)
    assert (hvd.local_rank(), hvd.local_size()) == (0, 1)
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.is_homogeneous()
    assert hvd.mpi_threads_supported()


def test_init_twice_is_harmless():
    hvd.init()
    hvd.init()
    assert hvd.size() == 1


def test_shutdown_then_init_again():
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"call hvd.init\(\) first"):
        hvd.rank()
    hvd.init()
    assert hvd.allreduce(tf.constant([2.0])).numpy().tolist() == [2.0]


def test_size_one_collectives():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(hvd.allreduce(x).numpy(), x.numpy())
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                postscale_factor=3.0).numpy(), 6 * x.numpy())
    np.testing.assert_array_equal(hvd.allgather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(hvd.broadcast(x, 0).numpy(), x.numpy())
    out, rsplits = hvd.alltoall(x, splits=[2])
    np.testing.assert_array_equal(out.numpy(), x.numpy())
    assert rsplits.numpy().tolist() == [2]
    np.testing.assert_array_equal(hvd.reducescatter(x, op=hvd.Sum).numpy(), x.numpy())
    assert hvd.join() == 0
    hvd.barrier()


def test_empty_tensor_is_valid():
    e = tf.zeros([0, 3])
    assert hvd.allreduce(e).shape == (0, 3)
    assert hvd.allgather(e).shape == (0, 3)
    assert hvd.broadcast(e, 0).shape == (0, 3)


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(TypeError, match="does not support dtype string"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(TypeError, match="does not support dtype bool"):
        hvd.allreduce(tf.constant([True]))


def test_root_rank_out_of_range():
    with pytest.raises(ValueError, match="root_rank 3 is out of range for 1 ranks"):
        hvd.broadcast(tf.constant([1.0]), root_rank=3)
    for bad in (True, 0.0, "0"):
        with pytest.raises(ValueError, match="root_rank .* is out of range"):
            hvd.broadcast(tf.constant([1.0]), root_rank=bad)


def test_a_numpy_integer_is_a_root_rank():
    # As in Horovod (TensorFlow's int attribute takes numpy integers): a root
    # read from a numpy array or computed with numpy.
    import numpy as np
    import tfhvd.tensorflow.keras as hvd_keras

    v = tf.Variable([2.0, 3.0])
    for root in (np.int64(0), np.int32(0), np.uint8(0)):
        assert hvd.broadcast(tf.constant([1.0]), root_rank=root).numpy().tolist() == [1.0]
        hvd.broadcast_([v], root_rank=root)
        hvd.broadcast_variables([v], root_rank=root)
        assert hvd.broadcast_object({"a": 1}, root_rank=root) == {"a": 1}
        assert hvd_keras.callbacks.BroadcastGlobalVariablesCallback(root).root_rank == 0
    assert v.numpy().tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match="root_rank np.int64.1. is out of range"):
        hvd.broadcast(tf.constant([1.0]), root_rank=np.int64(1))


def test_reducescatter_scalar():
    with pytest.raises(ValueError, match="cannot scatter a scalar"):
        hvd.reducescatter(tf.constant(1.0))


def test_alltoall_bad_splits():
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"splits \[2\] that sum to 2, but its first dimension is 3"):
        hvd.alltoall(tf.ones([3]), splits=[2])
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected one per rank"):
        hvd.alltoall(tf.ones([3]), splits=[1, 1, 1])
    # The runtime keeps working.
    assert hvd.allreduce(tf.constant(5.0)).numpy() == 5.0


def test_unknown_reduce_op():
    with pytest.raises(ValueError, match="unknown reduce op"):
        hvd.allreduce(tf.ones([2]), op=42)
    # Adasum over one rank is that rank's tensor (tests/parallel/test_adasum.py: N ranks).
    assert hvd.allreduce(tf.constant([1.0, -2.0]), op=hvd.Adasum).numpy().tolist() == [1, -2]


def test_build_info_and_version():
    from tests.conftest import library_ground_truth
    from tfhvd.common import library

    truth = library_ground_truth(library.library_path())
    # This CPU build links MPI and neither NCCL nor CUDA; the report must say so.
    # make setup installs libgloo-dev, so the library links Gloo too.
    assert truth == {"mpi": True, "nccl": False, "cuda": False, "gloo": True}, truth
    assert hvd.mpi_built() is True and hvd.mpi_enabled()
    assert hvd.nccl_built() is False and hvd.cuda_built() is False
    assert hvd.gloo_built() is True
    assert tfhvd.__version__ == hvd.__version__
    assert tfhvd.__version__.count(".") == 2
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def test_compression_round_trip():
    x = tf.constant([1.5, -2.25, 1e5], tf.float32)
    for comp, wire in ((hvd.Compression.fp16, tf.float16), (hvd.Compression.bf16, tf.bfloat16)):
        c, ctx = comp.compress(x)
        assert c.dtype == wire
        back = comp.decompress(c, ctx)
        assert back.dtype == tf.float32
    # bf16 keeps float32's range; fp16 overflows past 65504.
    assert np.isfinite(hvd.Compression.bf16.decompress(*hvd.Compression.bf16.compress(x)).numpy()).all()
    assert np.isinf(hvd.Compression.fp16.decompress(*hvd.Compression.fp16.compress(x)).numpy()[2])
    y = hvd.allreduce(x, compression=hvd.Compression.bf16)
    assert y.dtype == tf.float32


def test_sparse_gradients():
    emb = tf.Variable(tf.ones([10, 4]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, [1, 3]))
    tape = hvd.DistributedGradientTape(tape)
    (g,) = tape.gradient(loss, [emb])
    assert isinstance(g, tf.IndexedSlices)
    r = hvd.allreduce(g)
    assert isinstance(r, tf.IndexedSlices)
    assert sorted(r.indices.numpy().tolist()) == [1, 3]


def test_horovod_graph_loads(tmp_path):
    """A SavedModel that holds HorovodAllreduce / HorovodBroadcast runs with tfhvd."""

    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return hvd.allreduce(x, op=hvd.Sum) + hvd.broadcast(x, 0)

    tf.saved_model.save(M(), str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    np.testing.assert_array_equal(loaded(tf.constant([1.0, 2.0])).numpy(), [2.0, 4.0])
    graph = loaded.__call__.get_concrete_function().graph.as_graph_def()
    types = {n.op for f in graph.library.function for n in f.node_def} | {n.op for n in graph.node}
    assert {"HorovodAllreduce", "HorovodBroadcast"} <= types


def test_graph_def_with_horovod_attrs_only():
    """An op written by Horovod (no tfhvd-only attrs) imports and runs."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2], name="x")
    gd = g.as_graph_def()
    node = gd.node.add()
    node.name = "HorovodAllreduce_x_0"
    node.op = "HorovodAllreduce"
    node.input.append("x")
    node.attr["T"].type = tf.float32.as_datatype_enum
    node.attr["reduce_op"].i = hvd.Sum
    node.attr["prescale_factor"].f = 1.0
    node.attr["postscale_factor"].f = 1.0

    def fn(xv):
        return tf.graph_util.import_graph_def(gd, input_map={"x:0": xv},
                                              return_elements=["HorovodAllreduce_x_0:0"])[0]

    wrapped = tf.compat.v1.wrap_function(fn, [tf.TensorSpec([2], tf.float32)])
    np.testing.assert_array_equal(wrapped(tf.constant([3.0, 4.0])).numpy(), [3.0, 4.0])


def test_init_with_rank_list_and_mpi4py_comm():
    out = run_python(textwrap.dedent("""
        from mpi4py import MPI
        import tfhvd.tensorflow as hvd
        hvd.init(comm=MPI.COMM_WORLD)
        print("comm", hvd.rank(), hvd.size())
        hvd.shutdown()
        hvd.init(comm=[0])
        print("list", hvd.rank(), hvd.size())
        try:
            hvd.shutdown(); hvd.init(comm=[0, 5])
        except ValueError as e:
            print("error", e)
    """))
    assert out.returncode == 0, out.stderr
    assert "comm 0 1" in out.stdout and "list 0 1" in out.stdout
    assert "rank 5 is out of range" in out.stdout


def test_ops_before_init_say_call_init_first():
    out = run_python(textwrap.dedent("""
        import tensorflow as tf
        import tfhvd.tensorflow as hvd
        for fn in (lambda: hvd.allreduce(tf.ones([1])), lambda: hvd.rank(),
                   lambda: hvd.broadcast(tf.ones([1]), 0), lambda: hvd.join()):
            try:
                fn()
                print("no error")
            except ValueError as e:
                print("ok:", e)
        # The raw op also refuses, inside a tf.function.
        from tfhvd.common import library
        try:
            library.load()[0].horovod_allreduce(tf.ones([1]), reduce_op=1, prescale_factor=1.0,
                                                postscale_factor=1.0)
        except tf.errors.FailedPreconditionError as e:
            print("ok:", e.message)
    """))
    assert out.returncode == 0, out.stderr
    assert "no error" not in out.stdout
    assert out.stdout.count("call hvd.init() first") == 5, out.stdout


@pytest.fixture
def settings_env(monkeypatch):
    """Sets only the given TFHVD_/HOROVOD_ variables (the others removed) for
    ``hvd.settings()``, which parses the environment on every call, as init does."""
    for key in list(os.environ):
        if key.startswith(("TFHVD_", "HOROVOD_")):
            monkeypatch.delenv(key)

    def use(env: Dict[str, str]) -> Dict[str, str]:
        for key in list(os.environ):
            if key.startswith(("TFHVD_", "HOROVOD_")):
                monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return hvd.settings()
    return use


def test_settings_parsing_both_names(settings_env):
    s = settings_env({"HOROVOD_FUSION_THRESHOLD": "1048576", "TFHVD_CYCLE_TIME": "0.5",
                      "HOROVOD_CACHE_CAPACITY": "7", "HOROVOD_LOG_LEVEL": "error",
                      "TFHVD_STALL_CHECK_TIME_SECONDS": "5",
                      "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9"})
    assert [s["fusion_threshold_bytes"], s["cycle_time_ms"], s["cache_capacity"],
            s["log_level"], s["stall_check_time_s"], s["stall_shutdown_time_s"]] == \
        ["1048576", "0.5", "7", "error", "5", "9"]


def test_settings_tfhvd_name_wins(settings_env):
    s = settings_env({"HOROVOD_CACHE_CAPACITY": "7", "TFHVD_CACHE_CAPACITY": "9"})
    assert s["cache_capacity"] == "9"


@pytest.mark.parametrize("env,want", [({}, "1"), ({"TFHVD_GRAPH_INLINE": "0"}, "0"),
                                      ({"HOROVOD_GRAPH_INLINE": "0"}, "0"),
                                      ({"HOROVOD_GRAPH_INLINE": "0", "TFHVD_GRAPH_INLINE": "1"},
                                       "1")])
def test_graph_inline_setting(settings_env, env, want):
    """GRAPH_INLINE: on by default; off under either spelling; TFHVD_ wins."""
    assert settings_env(env)["graph_inline"] == want


_BAD_SETTINGS = [("TFHVD_FUSION_THRESHOLD", "64MB"), ("HOROVOD_CYCLE_TIME", "-1"),
                 ("TFHVD_LOG_LEVEL", "loud"), ("HOROVOD_STALL_CHECK_DISABLE", "maybe"),
                 ("TFHVD_GRAPH_INLINE", "sometimes"),
                 # An infinite cycle time slept for ever; an infinite or huge
                 # Gloo timeout overflowed Gloo's clock (a rank aborted).
                 ("HOROVOD_CYCLE_TIME", "inf"), ("HOROVOD_GLOO_TIMEOUT_SECONDS", "inf"),
                 ("HOROVOD_GLOO_TIMEOUT_SECONDS", "1e10")]


def test_bad_setting_is_a_clear_init_error():
    """Each bad value fails init with a ValueError naming the variable and the
    value, in one fresh process one after the other: a failed init leaves
    nothing behind, and the next init, with the settings fixed, runs."""
    out = run_python(textwrap.dedent("""
        import json, os, tempfile
        import tensorflow as tf
        import tfhvd.tensorflow as hvd
        try:
            hvd.stop_timeline()
            print("NO ERROR for stop_timeline before init")
        except ValueError as e:
            print("STOP BEFORE INIT", e)
        for var, value in %r:
            os.environ[var] = value
            try:
                hvd.init()
                print("NO ERROR for", var)
            except ValueError as e:
                print("ERR", e)
            del os.environ[var]
        # Horovod's HOROVOD_TIMELINE=DYNAMIC: no file until start_timeline.
        os.chdir(tempfile.mkdtemp())
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
        hvd.init()
        print("THEN", hvd.size(), hvd.allreduce(tf.constant([3.0]), op=hvd.Sum).numpy())
        hvd.start_timeline(os.path.abspath("started.json"))
        hvd.allreduce(tf.constant([1.0]), name="in_timeline")
        hvd.stop_timeline()
        rows = {e.get("args", {}).get("name") for e in json.load(open("started.json"))}
        print("FILES", sorted(os.listdir(".")), "in_timeline" in rows)
    """ % (_BAD_SETTINGS,)))
    assert out.returncode == 0, out.stderr
    assert "STOP BEFORE INIT tfhvd has not been initialized" in out.stdout, out.stdout
    for var, value in _BAD_SETTINGS:
        assert "ERR invalid value '%s' for %s" % (value, var) in out.stdout, out.stdout
    assert "FILES ['started.json'] True" in out.stdout, out.stdout
    assert "NO ERROR" not in out.stdout
    assert "THEN 1 [3.]" in out.stdout, out.stdout


def test_clean_exit_without_explicit_shutdown():
    out = run_python("import tensorflow as tf, tfhvd.tensorflow as hvd\n"
                     "hvd.init(); hvd.allreduce(tf.ones([4])); print('done')\n")
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout
    assert "exited improperly" not in out.stderr


def test_benchmark_reference_op_returns_its_input():
    """TfhvdAsyncIdentity, the benchmarks' floor (graph_benchmark --floor, the eager
    breakdown): an asynchronous op with HorovodAllreduce's attrs that returns its input,
    eagerly and inside a tf.function, and moves no data between ranks."""
    from tfhvd.tensorflow import mpi_ops

    op = mpi_ops._ops().tfhvd_async_identity
    x = tf.constant([[1.5, -2.0], [3.0, 4.25]])
    np.testing.assert_array_equal(op(x, reduce_op=hvd.Sum, tensor_name="ref").numpy(), x.numpy())

    @tf.function
    def split_and_join(t):
        return tf.concat([op(p) for p in tf.split(t, 2)], 0)

    np.testing.assert_array_equal(split_and_join(x).numpy(), x.numpy())
    assert "TfhvdAsyncIdentity" in {
        n.op for n in split_and_join.get_concrete_function(x).graph.as_graph_def().node}
