"""Loads the one compiled tfhvd library, once per process.

TensorFlow must load it first (``tf.load_op_library`` only sees the ops that
register while it loads the file); ctypes then opens the same, already loaded
file for the C API.  Every front end (``tfhvd.tensorflow``, ``tfhvd.keras``,
``tfhvd.tensorflow.keras``) goes through :func:`load`, so they share one
runtime.

The library is built against one TensorFlow release and records its version
(``tfhvd_ops/tensorflow/build_info.cc``).  A library built against another
TensorFlow than the one running may not load, or may crash later (TensorFlow's
C++ ABI changes between releases), so :func:`load` checks first and raises an
ImportError that names both versions and says how to rebuild.
"""

import ctypes
import os
import re
import threading
from typing import Any, Optional, Tuple

_LIB_NAME = "tfhvd_ops.so"
# The marker build_info.cc compiles into the library, followed by the version and a NUL.
_TF_VERSION_MARKER = b"tfhvd-built-against-tensorflow="
REBUILD_HINT = (
    "Rebuild tfhvd against the TensorFlow of this Python: "
    "pip install --no-build-isolation --force-reinstall --no-deps <tfhvd source directory or "
    "sdist> (in a tfhvd source checkout with its own venv: make setup)")
_lock = threading.Lock()
_loaded: Optional[Tuple[Any, ctypes.CDLL]] = None


def library_path() -> str:
    """Path of the compiled library inside the installed package."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _LIB_NAME)


def built_tf_version(path: Optional[str] = None) -> Optional[str]:
    """The TensorFlow version the library at ``path`` (default: the package's)
    was built against, read from the file without loading it; None when the
    library carries no version (built by hand without setup.py)."""
    with open(path or library_path(), "rb") as f:
        data = f.read()
    start = data.find(_TF_VERSION_MARKER)
    if start < 0:
        return None
    start += len(_TF_VERSION_MARKER)
    end = data.find(b"\0", start)
    version = data[start:end].decode("ascii", errors="replace")
    return version or None


def _release(version: str) -> Tuple[int, ...]:
    """(major, minor) of a TensorFlow version string ("2.21.0", "2.22.0-rc1")."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def check_tf_version(built: Optional[str], running: str, path: str) -> None:
    """Raises ImportError when the library (at ``path``) was built against a
    different TensorFlow release (major.minor) than the ``running`` one.

    Patch releases of one release line are not told apart (they are fix
    releases from the same branch): a library built against 2.21.0 loads
    under 2.21.1.  A library without a recorded version (``built`` None) is
    not checked.
    """
    if built is None or _release(built) == _release(running):
        return
    raise ImportError(
        "tfhvd's compiled library (%s) was built against TensorFlow %s, but this Python "
        "runs TensorFlow %s; a custom-op library only works with the TensorFlow release it "
        "was compiled against. %s." % (path, built, running, REBUILD_HINT))


def load() -> Tuple[Any, ctypes.CDLL]:
    """Returns ``(tf_ops_module, c_api)``, loading the library on first use."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        if not os.path.exists(path):
            raise ImportError(
                "tfhvd's compiled library is missing (%s). Build it with `make setup` "
                "(or `pip install --no-build-isolation .`) in the tfhvd source tree." % path
            )
        import tensorflow as tf

        check_tf_version(built_tf_version(path), tf.__version__, path)
        ops = tf.load_op_library(path)
        capi = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        _declare(capi)
        _loaded = (ops, capi)
        return _loaded


def capi() -> ctypes.CDLL:
    """The C API (loads the library if needed)."""
    return load()[1]


def _declare(lib: ctypes.CDLL) -> None:
    errbuf = [ctypes.c_char_p, ctypes.c_int]
    lib.tfhvd_init.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p] + errbuf
    lib.tfhvd_init.restype = ctypes.c_int
    lib.tfhvd_parse_settings.argtypes = errbuf
    lib.tfhvd_start_timeline.argtypes = [ctypes.c_char_p, ctypes.c_int] + errbuf
    lib.tfhvd_finalize.restype = None
    intp = ctypes.POINTER(ctypes.c_int)
    lib.tfhvd_add_process_set.argtypes = [intp, ctypes.c_int, ctypes.c_int, intp] + errbuf
    lib.tfhvd_remove_process_set.argtypes = [ctypes.c_int] + errbuf
    lib.tfhvd_remove_process_set_ex.argtypes = [ctypes.c_int, ctypes.c_int] + errbuf
    lib.tfhvd_process_set_info.argtypes = [ctypes.c_int, intp, intp, intp, ctypes.c_int]
    lib.tfhvd_process_set_ids.argtypes = [intp, ctypes.c_int]
    lib.tfhvd_gpu_code_info.restype = ctypes.c_char_p
    lib.tfhvd_gpu_versions_info.restype = ctypes.c_char_p
    lib.tfhvd_graph_inline_runs.restype = ctypes.c_longlong
    lib.tfhvd_autotune_state.argtypes = errbuf
