"""Loads the one compiled tfhvd library, once per process.

TensorFlow must load it first (``tf.load_op_library`` only sees the ops that
register while it loads the file); ctypes then opens the same, already loaded
file for the C API.  Every front end (``tfhvd.tensorflow``, ``tfhvd.keras``,
``tfhvd.tensorflow.keras``) goes through :func:`load`, so they share one
runtime.
"""

import ctypes
import os
import threading
from typing import Any, Optional, Tuple

_LIB_NAME = "tfhvd_ops.so"
_lock = threading.Lock()
_loaded: Optional[Tuple[Any, ctypes.CDLL]] = None


def library_path() -> str:
    """Path of the compiled library inside the installed package."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _LIB_NAME)


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
    lib.tfhvd_graph_inline_runs.restype = ctypes.c_longlong
