"""tfhvd.spark.common.store: Store.create's choice, each Store's path handling,
and FilesystemStore's reads and writes on local paths and an fsspec URL
(memory://).  One process; no Spark job, no HDFS."""

import os
import pickle

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("fsspec")

from tfhvd.spark.common import store as store_mod  # noqa: E402
from tfhvd.spark.common.store import (DBFSLocalStore, FilesystemStore, HDFSStore,  # noqa: E402
                                      LocalStore, Store)


def test_create_picks_the_store(tmp_path, monkeypatch):
    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    assert type(Store.create(str(tmp_path))) is FilesystemStore
    assert type(Store.create("memory://work")) is FilesystemStore
    assert type(Store.create("hdfs://nn:8020/user/me")) is HDFSStore
    # DBFS paths mean DBFS on Databricks only (as in Horovod).
    assert type(Store.create("/dbfs/tmp/work")) is FilesystemStore
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    assert type(Store.create("dbfs:/tmp/work")) is DBFSLocalStore


def test_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = LocalStore("work")
    base = "file://%s/work" % tmp_path
    assert s.prefix_path == base
    assert s.get_train_data_path() == base + "/intermediate_train_data"
    assert s.get_train_data_path(3) == base + "/intermediate_train_data.3"
    assert s.get_val_data_path(0) == base + "/intermediate_val_data.0"
    assert s.get_test_data_path() == base + "/intermediate_test_data"
    assert s.get_run_path("r1") == base + "/runs/r1"
    assert s.get_checkpoint_path("r1") == base + "/runs/r1"
    assert s.get_checkpoint_filename() == "checkpoint.keras"
    assert s.get_logs_path("r1") == base + "/runs/r1/logs"
    assert s.get_localized_path(s.get_run_path("r1")) == "%s/work/runs/r1" % tmp_path
    assert s.get_full_path("/abs/x") == "file:///abs/x"
    custom = FilesystemStore(str(tmp_path), train_path="/data/t", runs_path="file:///r",
                             save_runs=False, checkpoint_filename="ck.keras")
    assert custom.get_train_data_path() == "file:///data/t"
    assert custom.get_runs_path() == "file:///r"
    assert custom.get_checkpoint_path("x") is None and custom.get_logs_path("x") is None
    assert custom.get_checkpoint_filename() == "ck.keras"


def test_local_reads_writes_sync_and_pickling(tmp_path):
    s = Store.create(str(tmp_path / "w"))
    path = s.get_run_path("r") + "/notes.txt"
    assert not s.exists(path)
    s.write_text(path, "hello")
    assert s.exists(path) and s.read(path) == b"hello"
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "checkpoint.keras").write_bytes(b"ck")
    (local / "sub" / "a.ckpt").write_bytes(b"a")
    s.sync_fn("r")(str(local))
    assert s.read(s.get_run_path("r") + "/checkpoint.keras") == b"ck"
    assert s.read(s.get_run_path("r") + "/sub/a.ckpt") == b"a"
    with s.get_local_output_dir_fn("r")() as d:
        assert os.path.isdir(d)
    assert not os.path.exists(d)
    again = pickle.loads(pickle.dumps(s))
    assert again._fs is None and again.read(path) == b"hello"


def test_parquet_listing(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    s = Store.create(str(tmp_path))
    d = tmp_path / "intermediate_train_data"
    d.mkdir()
    for name in ("part-00001.parquet", "part-00000.parquet"):
        pq.write_table(pa.table({"x": [1.0, 2.0]}), str(d / name))
    (d / "_SUCCESS").write_text("")
    (d / "_meta.parquet").write_text("")
    files = s.list_parquet_files(s.get_train_data_path())
    assert [os.path.basename(f) for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    assert s.is_parquet_dataset(s.get_train_data_path())
    assert not s.is_parquet_dataset(s.get_val_data_path())
    assert s.get_parquet_dataset(s.get_train_data_path()).read().num_rows == 4


def test_fsspec_url_store():
    s = FilesystemStore("memory://tfhvd-test/work", storage_options={})
    assert s.prefix_path == "memory://tfhvd-test/work"
    assert s.get_train_data_path() == "memory://tfhvd-test/work/intermediate_train_data"
    assert s.get_localized_path(s.get_run_path("r")) == "/tfhvd-test/work/runs/r"
    s.write_text(s.get_run_path("r") + "/f", "x")
    assert s.exists(s.get_run_path("r") + "/f")
    assert s.fs.exists("/tfhvd-test/work/runs/r/f")


def test_hdfs_paths_need_no_hdfs():
    s = HDFSStore("hdfs://namenode01:8020/user/test/work")
    assert s.hdfs_kwargs["host"] == "namenode01" and s.hdfs_kwargs["port"] == 8020
    assert s.prefix_path == "hdfs://namenode01:8020/user/test/work"
    assert s.get_run_path("r") == "hdfs://namenode01:8020/user/test/work/runs/r"
    assert s.get_localized_path(s.get_run_path("r")) == "/user/test/work/runs/r"
    assert s.get_full_path("/other") == "hdfs://namenode01:8020/other"
    bare = HDFSStore("hdfs:///user/test/work")
    assert bare.prefix_path == "hdfs:///user/test/work"
    assert bare.hdfs_kwargs["host"] == "default" and bare.hdfs_kwargs["port"] == 0
    plain = HDFSStore("/user/test/work", host="nn2", port=9000, user="me")
    assert plain.prefix_path == "hdfs:///user/test/work"
    assert plain.hdfs_kwargs == dict(host="nn2", port=9000, user="me", kerb_ticket=None,
                                     extra_conf=None)
    assert plain.get_localized_path("hdfs:///user/test/x") == "/user/test/x"
    with pytest.raises(ValueError, match="Mismatched HDFS namespace for URL: s3://b/x"):
        HDFSStore("s3://b/x")
    with pytest.raises(ValueError, match="Failed to parse path from URL: hdfs://nn:8020"):
        HDFSStore("hdfs://nn:8020")
    # Nothing connected, and the store pickles without a filesystem.
    assert s._fs is None and pickle.loads(pickle.dumps(s))._fs is None


@pytest.mark.parametrize("path", ["/dbfs/tmp/w", "dbfs:/tmp/w", "file:/dbfs/tmp/w",
                                  "file:///dbfs/tmp/w"])
def test_dbfs_paths(path):
    s = DBFSLocalStore(path)
    assert s.prefix_path == "file:///dbfs/tmp/w"
    assert s.get_run_path("r") == "file:///dbfs/tmp/w/runs/r"
    assert s.get_localized_path(s.get_run_path("r")) == "/dbfs/tmp/w/runs/r"
    assert s.get_localized_path("dbfs:/x/y") == "/dbfs/x/y"
    assert DBFSLocalStore.matches_dbfs(path)


def test_dbfs_rejects_other_paths():
    assert not DBFSLocalStore.matches_dbfs("dbfs://host/x")
    with pytest.raises(ValueError, match=r"not a DBFS path: /tmp/w"):
        DBFSLocalStore("/tmp/w")
    assert store_mod.DBFSLocalStore.normalize_path("dbfs:/a") == "/dbfs/a"
