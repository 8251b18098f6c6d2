"""Stores: where an estimator keeps its intermediate data and its runs.

A Store names the paths of one estimator's work: the DataFrames written as
Parquet (``intermediate_train_data``, ``intermediate_val_data``, with an
optional ``.<idx>`` suffix per dataset), and one folder per run under
``runs/<run_id>`` holding the checkpoint (``checkpoint.keras``) and ``logs``.
Spark writes the Parquet through the *full* path (with its scheme, e.g.
``file:///tmp/work`` or ``hdfs://nn:8020/user/me``); the training ranks read
it, and write checkpoints, through an `fsspec <https://filesystem-spec.readthedocs.io>`_
filesystem and the *localized* path (without scheme and host).

``Store.create(path)`` picks the Store as Horovod does: ``hdfs://`` paths get
an :class:`HDFSStore`, DBFS paths on Databricks a :class:`DBFSLocalStore`,
anything else (a local path or any fsspec URL) a :class:`FilesystemStore`.
A Store is pickled to the Spark tasks; its filesystem is created again there.
"""

import contextlib
import os
import pathlib
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit

CHECKPOINT_FILENAME = "checkpoint.keras"


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - the [spark] extra installs it
        raise ImportError("tfhvd.spark's Stores need fsspec: pip install fsspec "
                          "(or the tfhvd[spark] extra)") from e
    return fsspec


def is_databricks() -> bool:
    """Whether this process runs on Databricks (its runtime sets this variable)."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


class Store:
    """Storage for an estimator's intermediate data and its runs (checkpoints, logs).

    Every run of an estimator gets its own folder ``<runs>/<run_id>``; every
    dataset its own data paths (``get_train_data_path(idx)``), which are kept
    after training so that ``fit_on_parquet`` can train on them again.
    """

    def is_parquet_dataset(self, path: str) -> bool:
        """Whether ``path`` is the root of a Parquet dataset."""
        raise NotImplementedError()

    def get_parquet_dataset(self, path: str) -> Any:
        """``path`` as a :class:`pyarrow.parquet.ParquetDataset`."""
        raise NotImplementedError()

    def get_train_data_path(self, idx: Optional[Any] = None) -> str:
        """The training data's path (with ``.<idx>`` when ``idx`` is given)."""
        raise NotImplementedError()

    def get_val_data_path(self, idx: Optional[Any] = None) -> str:
        """The validation data's path (with ``.<idx>`` when ``idx`` is given)."""
        raise NotImplementedError()

    def get_test_data_path(self, idx: Optional[Any] = None) -> str:
        """The test data's path (with ``.<idx>`` when ``idx`` is given)."""
        raise NotImplementedError()

    def saving_runs(self) -> bool:
        """Whether runs write checkpoints and logs."""
        raise NotImplementedError()

    def get_runs_path(self) -> str:
        """The folder of all runs."""
        raise NotImplementedError()

    def get_run_path(self, run_id: str) -> str:
        """The folder of one run."""
        raise NotImplementedError()

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        """The folder of a run's checkpoint (None when runs are not saved)."""
        raise NotImplementedError()

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> List[str]:
        """The run's checkpoint files ending in ``suffix``, sorted."""
        raise NotImplementedError()

    def get_logs_path(self, run_id: str) -> Optional[str]:
        """The folder of a run's logs (None when runs are not saved)."""
        raise NotImplementedError()

    def get_checkpoint_filename(self) -> str:
        """The checkpoint's file name inside the run folder."""
        raise NotImplementedError()

    def get_logs_subdir(self) -> str:
        """The logs' folder name inside the run folder."""
        raise NotImplementedError()

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the store."""
        raise NotImplementedError()

    def read(self, path: str) -> bytes:
        """The bytes of the file at ``path``."""
        raise NotImplementedError()

    def write_text(self, path: str, text: str) -> None:
        """Writes ``text`` to the file at ``path``."""
        raise NotImplementedError()

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """A context-manager factory giving a local folder for a run's output."""
        raise NotImplementedError()

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        """A function that copies a local folder into the run's folder."""
        raise NotImplementedError()

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> "Store":
        """The Store for ``prefix_path``: :class:`HDFSStore` for ``hdfs://``,
        :class:`DBFSLocalStore` for a DBFS path on Databricks, else a
        :class:`FilesystemStore` (local paths and any fsspec URL)."""
        if HDFSStore.matches(prefix_path):
            return HDFSStore(prefix_path, *args, **kwargs)
        if is_databricks() and DBFSLocalStore.matches_dbfs(prefix_path):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)


class AbstractFilesystemStore(Store):
    """A Store on one filesystem; subclasses say how paths map to it.

    Args:
      prefix_path: the folder under which the default paths are made.
      train_path, val_path, test_path, runs_path: override the default
        ``intermediate_train_data``, ``intermediate_val_data``,
        ``intermediate_test_data`` and ``runs`` paths.
      save_runs: write checkpoints and logs (default True).
      storage_options: options for the fsspec filesystem (credentials...).
      checkpoint_filename: the checkpoint's name (default ``checkpoint.keras``).
    """

    def __init__(self, prefix_path: str, train_path: Optional[str] = None,
                 val_path: Optional[str] = None, test_path: Optional[str] = None,
                 runs_path: Optional[str] = None, save_runs: bool = True,
                 storage_options: Optional[Dict[str, Any]] = None,
                 checkpoint_filename: Optional[str] = None, **_ignored: Any) -> None:
        self.storage_options = dict(storage_options or {})
        self.prefix_path = self.get_full_path(prefix_path)
        self._train_path = self._full_or_default(train_path, "intermediate_train_data")
        self._val_path = self._full_or_default(val_path, "intermediate_val_data")
        self._test_path = self._full_or_default(test_path, "intermediate_test_data")
        self._runs_path = self._full_or_default(runs_path, "runs")
        self._save_runs = save_runs
        self.checkpoint_filename = checkpoint_filename or CHECKPOINT_FILENAME
        self._fs: Any = None

    # -- pickling: the filesystem is made again where the Store is used
    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None
        return state

    def _make_fs(self) -> Any:
        raise NotImplementedError()

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created on first use)."""
        if self._fs is None:
            self._fs = self._make_fs()
        return self._fs

    def get_filesystem(self) -> Any:
        """The fsspec filesystem."""
        return self.fs

    def get_localized_path(self, path: str) -> str:
        """``path`` as the filesystem names it (no scheme or host)."""
        raise NotImplementedError()

    def get_full_path(self, path: str) -> str:
        """``path`` with its scheme (as Spark reads and writes it)."""
        return self.get_full_path_fn()(path)

    def get_full_path_fn(self) -> Callable[[str], str]:
        """A picklable function giving a path's full form."""
        raise NotImplementedError()

    def _full_or_default(self, path: Optional[str], key: str) -> str:
        if path is not None:
            return self.get_full_path(path)
        return self.prefix_path.rstrip("/") + "/" + key

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self.get_localized_path(path)))

    def read(self, path: str) -> bytes:
        with self.fs.open(self.get_localized_path(path), "rb") as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Writes ``data`` to the file at ``path`` (its folder is created)."""
        local = self.get_localized_path(path)
        self.fs.makedirs(os.path.dirname(local) or "/", exist_ok=True)
        with self.fs.open(local, "wb") as f:
            f.write(data)

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def list_parquet_files(self, path: str) -> List[str]:
        """The localized paths of the ``.parquet`` files under ``path``, sorted."""
        local = self.get_localized_path(path)
        if not self.fs.exists(local):
            return []
        found = self.fs.find(local)
        return sorted(p for p in found if p.endswith(".parquet")
                      and not os.path.basename(p).startswith(("_", ".")))

    def is_parquet_dataset(self, path: str) -> bool:
        return bool(self.list_parquet_files(path))

    def get_parquet_dataset(self, path: str) -> Any:
        import pyarrow.parquet as pq
        return pq.ParquetDataset(self.list_parquet_files(path), filesystem=self.fs)

    def get_train_data_path(self, idx: Optional[Any] = None) -> str:
        return self._train_path if idx is None else "%s.%s" % (self._train_path, idx)

    def get_val_data_path(self, idx: Optional[Any] = None) -> str:
        return self._val_path if idx is None else "%s.%s" % (self._val_path, idx)

    def get_test_data_path(self, idx: Optional[Any] = None) -> str:
        return self._test_path if idx is None else "%s.%s" % (self._test_path, idx)

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return self._runs_path.rstrip("/") + "/" + run_id

    def get_checkpoint_path(self, run_id: str) -> Optional[str]:
        return self.get_run_path(run_id) if self._save_runs else None

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> List[str]:
        path = self.get_checkpoint_path(run_id)
        if path is None or not self.exists(path):
            return []
        return sorted(p for p in self.fs.ls(self.get_localized_path(path), detail=False)
                      if p.endswith(suffix))

    def get_logs_path(self, run_id: str) -> Optional[str]:
        return self.get_run_path(run_id) + "/" + self.get_logs_subdir() \
            if self._save_runs else None

    def get_checkpoint_filename(self) -> str:
        return self.checkpoint_filename

    def get_logs_subdir(self) -> str:
        return "logs"

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        @contextlib.contextmanager
        def local_run_path() -> Iterator[str]:
            with tempfile.TemporaryDirectory(prefix="tfhvd-run-") as tmp:
                yield tmp
        return local_run_path

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        run_path = self.get_run_path(run_id)

        def sync(local_dir: str) -> None:
            """Copies every file under ``local_dir`` to the same place in the run."""
            for root, _dirs, files in os.walk(local_dir):
                rel = os.path.relpath(root, local_dir)
                for name in files:
                    target = run_path if rel == "." else run_path + "/" + rel.replace(os.sep, "/")
                    with open(os.path.join(root, name), "rb") as f:
                        self.write_bytes(target + "/" + name, f.read())
        return sync


def _as_file_uri(path: str) -> str:
    return pathlib.Path(os.path.abspath(path)).as_uri()


class FilesystemStore(AbstractFilesystemStore):
    """A Store on any fsspec filesystem: a local path (made absolute, used as
    ``file://``), or a URL such as ``s3://bucket/prefix`` or ``memory://x``
    (its fsspec implementation must be installed, and reachable from the
    Spark executors).  ``storage_options`` go to the filesystem."""

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(prefix_path, *args, **kwargs)
        from fsspec.core import split_protocol
        self.protocol = split_protocol(self.prefix_path)[0] or "file"

    def _make_fs(self) -> Any:
        fsspec = _fsspec()
        cls = fsspec.get_filesystem_class(self.protocol)
        options = dict(cls._get_kwargs_from_urls(self.prefix_path))
        options.update(self.storage_options)
        return cls(**options)

    def get_localized_path(self, path: str) -> str:
        fsspec = _fsspec()
        from fsspec.core import split_protocol
        protocol = split_protocol(path)[0] or "file"
        return fsspec.get_filesystem_class(protocol)._strip_protocol(path)

    def get_full_path_fn(self) -> Callable[[str], str]:
        def full_path(path: str) -> str:
            from fsspec.core import split_protocol
            if split_protocol(path)[0] is not None:
                return path
            return _as_file_uri(path)
        return full_path


class LocalStore(FilesystemStore):
    """A Store on the local filesystem (a path every Spark executor sees, such as
    a shared mount); Horovod keeps this name for :class:`FilesystemStore`."""


class HDFSStore(AbstractFilesystemStore):
    """A Store on HDFS, from ``hdfs://namenode:8020/user/me/work``,
    ``hdfs:///user/me/work`` or ``/user/me/work``.

    Spark reads and writes the full path (``hdfs://`` with the URL's host and
    port, if any); the ranks reach HDFS through fsspec's ``hdfs`` filesystem
    (pyarrow's ``HadoopFileSystem``, which needs libhdfs and a Hadoop
    classpath), with ``host``/``port`` from the arguments, else the URL, else
    ``default`` and 0 (the namenode of the Hadoop configuration).  Nothing
    connects until the data or a checkpoint is read or written.
    """

    FS_PREFIX = "hdfs://"

    def __init__(self, prefix_path: str, host: Optional[str] = None, port: Optional[int] = None,
                 user: Optional[str] = None, kerb_ticket: Optional[str] = None,
                 driver: str = "libhdfs", extra_conf: Optional[Dict[str, str]] = None,
                 *args: Any, **kwargs: Any) -> None:
        url_prefix, url_host, url_port, _path = self.parse_url(prefix_path)
        self._url_prefix = url_prefix
        self._hdfs_kwargs = dict(host=host or url_host or "default", port=port or url_port or 0,
                                 user=user, kerb_ticket=kerb_ticket, extra_conf=extra_conf)
        self._driver = driver
        super().__init__(prefix_path, *args, **kwargs)

    @classmethod
    def parse_url(cls, url: str) -> Tuple[str, Optional[str], Optional[int], str]:
        """``(prefix, host, port, path)`` of an HDFS URL or plain path; the
        prefix is what full paths start with (``hdfs://nn:8020`` or ``hdfs://``)."""
        if "://" not in url:
            if not url.startswith("/"):
                raise ValueError("HDFSStore needs an absolute path or an hdfs:// URL, got %r"
                                 % url)
            return cls.FS_PREFIX, None, None, url
        parts = urlsplit(url)
        if parts.scheme + "://" != cls.FS_PREFIX:
            raise ValueError("Mismatched HDFS namespace for URL: %s. Found %s but expected %s"
                             % (url, parts.scheme + "://", cls.FS_PREFIX))
        if not parts.path or parts.path == "/":
            raise ValueError("Failed to parse path from URL: %s" % url)
        prefix = cls.FS_PREFIX + parts.netloc
        return prefix, parts.hostname, parts.port, parts.path

    @property
    def hdfs_kwargs(self) -> Dict[str, Any]:
        """What the fsspec ``hdfs`` filesystem is made with."""
        return dict(self._hdfs_kwargs)

    def _make_fs(self) -> Any:
        return _fsspec().filesystem("hdfs", **self._hdfs_kwargs)

    def get_localized_path(self, path: str) -> str:
        if path.startswith(self._url_prefix):
            return path[len(self._url_prefix):] or "/"
        if self.matches(path):
            return self.parse_url(path)[3]
        return path

    def get_full_path_fn(self) -> Callable[[str], str]:
        prefix = self._url_prefix

        def full_path(path: str) -> str:
            return path if path.startswith(HDFSStore.FS_PREFIX) else prefix + path
        return full_path

    @classmethod
    def matches(cls, path: str) -> bool:
        """Whether ``path`` is an ``hdfs://`` URL."""
        return path.startswith(cls.FS_PREFIX)


class DBFSLocalStore(FilesystemStore):
    """A Store on Databricks' DBFS through its local mount ``/dbfs``; takes
    ``/dbfs/...``, ``dbfs:/...``, ``file:/dbfs/...`` or ``file:///dbfs/...``
    and uses ``/dbfs/...`` (Spark: ``file:///dbfs/...``)."""

    DBFS_PATH_FORMAT_ERROR = ("The provided path is not a DBFS path: {}, Please provide a path "
                              "starting with `/dbfs/...` or `dbfs:/...` or `file:/dbfs/...` or "
                              "`file:///dbfs/...`.")

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(self.normalize_path(prefix_path), *args, **kwargs)

    @classmethod
    def matches_dbfs(cls, path: str) -> bool:
        """Whether ``path`` is one of the DBFS forms."""
        return (path.startswith("dbfs:/") and not path.startswith("dbfs://")) \
            or path.startswith(("/dbfs/", "file:///dbfs/", "file:/dbfs/"))

    @classmethod
    def normalize_path(cls, path: str) -> str:
        """A DBFS path in its ``/dbfs/...`` form; ValueError for anything else."""
        if path.startswith("dbfs:/") and not path.startswith("dbfs://"):
            return "/dbfs" + path[len("dbfs:"):]
        for prefix in ("/dbfs/", "file:///dbfs/", "file:/dbfs/"):
            if path.startswith(prefix):
                return "/dbfs/" + path[len(prefix):]
        raise ValueError(cls.DBFS_PATH_FORMAT_ERROR.format(path))

    def get_localized_path(self, path: str) -> str:
        return self.normalize_path(path)

    def get_full_path_fn(self) -> Callable[[str], str]:
        def full_path(path: str) -> str:
            return "file://" + DBFSLocalStore.normalize_path(path)
        return full_path


__all__ = ["Store", "AbstractFilesystemStore", "FilesystemStore", "LocalStore", "HDFSStore",
           "DBFSLocalStore", "is_databricks"]
