"""The helpers Horovod's ``horovod.common.util`` gives its programs and tests.

``horovod.tensorflow`` re-exports ``check_extension``, ``gpu_available`` and
``split_list`` from there, and Horovod's own test files import
``is_version_greater_equal_than`` and ``env`` from it; a program that changes
only its import (``horovod`` to ``tfhvd``) finds them here with the same
behaviour.  ``gpu_available('tensorflow')`` answers for tfhvd's TensorFlow
front end.
"""

import contextlib
import functools
import os
import sysconfig
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

# Horovod's frameworks; tfhvd has only TensorFlow (its Keras modules run on it).
EXTENSIONS = ["tensorflow", "torch", "mxnet"]


def get_ext_suffix() -> str:
    """The file suffix of this Python's extension modules (``.cpython-311-x86_64-linux-gnu.so``)."""
    return sysconfig.get_config_var("EXT_SUFFIX") or sysconfig.get_config_var("SO") or ".so"


def get_extension_full_path(pkg_path: str, *args: str) -> str:
    """``dirname(pkg_path)/args[0]/.../args[-1]<suffix>``: where a compiled module lives."""
    if not args:
        raise ValueError("get_extension_full_path needs the extension's name after pkg_path")
    directory = os.path.join(os.path.dirname(pkg_path), *args[:-1])
    return os.path.join(directory, args[-1] + get_ext_suffix())


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: str) -> None:
    """Raises ImportError naming ``ext_name`` when its compiled module (see
    :func:`get_extension_full_path`) does not exist, and how to rebuild it."""
    full_path = get_extension_full_path(pkg_path, *args)
    if not os.path.exists(full_path):
        raise ImportError("%s is missing its compiled module (no file %s).\n"
                          "To see why the build left it out, reinstall with %s=1."
                          % (ext_name, full_path, ext_env_var))


def _cache(f: Callable) -> Callable:
    """Memoises ``f`` on its (hashable) arguments, as Horovod's helpers are."""
    cache: Dict[Any, Any] = {}

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in cache:
            cache[key] = f(*args, **kwargs)
        return cache[key]

    return wrapper


def _tensorflow_has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the front end ``ext_base_name`` ('tensorflow', 'torch', 'mxnet') is built:
    only 'tensorflow' is, in tfhvd."""
    available = ext_base_name == "tensorflow"
    if verbose:
        print("Extension %s %s built." % (ext_base_name, "was" if available else "was NOT"))
    return available


@_cache
def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the framework ``ext_base_name`` sees a GPU here (Horovod's helper).

    For 'tensorflow' this lists TensorFlow's physical GPU devices, which does
    not allocate GPU memory, so ``set_memory_growth`` and visible-device
    settings still work afterwards.  Frameworks tfhvd has no front end for
    ('torch', 'mxnet') give False, as Horovod does for an extension it lacks.
    The answer is cached per arguments.
    """
    result = False
    if extension_available(ext_base_name):
        try:
            result = _tensorflow_has_gpu()
        except Exception as e:  # as Horovod: a failing check means no GPU
            if verbose:
                print("Checking for a GPU with %s failed: %s" % (ext_base_name, e))
            result = False
    if verbose:
        print("Extension %s %s running with GPU." % (ext_base_name,
                                                     "was" if result else "was NOT"))
    return result


@contextlib.contextmanager
def env(**kwargs: Optional[str]) -> Iterator[None]:
    """Sets environment variables for the ``with`` block (None values are
    ignored) and restores the previous values afterwards."""
    values = {k: v for k, v in kwargs.items() if v is not None}
    backup = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in backup.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable:
    """A function ``(op, average) -> op``: the old ``average=`` argument mapped to
    ``reduce_ops.Average``/``Sum`` (with a DeprecationWarning); giving both raises
    ValueError; neither gives Average."""
    def impl(op: Optional[int], average: Optional[bool]) -> int:
        if average is None:
            # The usual case: the caller used only the new argument (or nothing).
            return reduce_ops.Average if op is None else op
        if op is not None:
            raise ValueError("Both op=%r and the deprecated average=%r were given; pass only "
                             "op (average is its old spelling)" % (op, average))
        warnings.warn("The `average` argument is deprecated and will go away in v1.0; "
                      "pass op=Average or op=Sum instead", DeprecationWarning)
        return reduce_ops.Sum if not average else reduce_ops.Average
    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    """Whether ``num_rank`` is a power of two (Adasum's rank-count rule)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(l: Sequence[Any], n: int) -> List[Sequence[Any]]:  # noqa: E741 (Horovod's name)
    """Splits ``l`` into ``n`` consecutive chunks whose lengths differ by at most one
    (the longer ones first)."""
    if n == 0:
        raise ZeroDivisionError("split_list: cannot split a sequence into 0 chunks")
    chunks: List[Sequence[Any]] = []
    start = 0
    left = len(l)
    for parts_left in range(n, 0, -1):
        # Ceiling division: the remaining items shared over the remaining parts,
        # so the leftover items go to the first chunks.
        size = -(-left // parts_left)
        chunks.append(l[start:start + size])
        start += size
        left -= size
    return chunks


def is_iterable(x: Any) -> bool:
    """Whether ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


@_cache
def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether version string ``ver`` >= ``target`` (``major.minor.patch``)."""
    from packaging import version

    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError("is_version_greater_equal_than compares two version strings; got "
                         "ver=%r (%s) and target=%r (%s)"
                         % (ver, type(ver).__name__, target, type(target).__name__))
    if len(target.split(".")) != 3:
        raise ValueError("target version %r must have three dot-separated parts "
                         "(major.minor.patch)" % (target,))
    return version.parse(ver) >= version.parse(target)


def _built(name: str) -> Callable[..., Optional[bool]]:
    def check(verbose: bool = False) -> Optional[bool]:
        from tfhvd.common import basics

        return bool(getattr(basics, name)())
    check.__name__ = name
    check.__doc__ = "Whether tfhvd was built with %s (Horovod's ``util.%s``)." % (
        name[:-len("_built")].upper(), name)
    return check


mpi_built = _built("mpi_built")
gloo_built = _built("gloo_built")
nccl_built = _built("nccl_built")
ddl_built = _built("ddl_built")
ccl_built = _built("ccl_built")
