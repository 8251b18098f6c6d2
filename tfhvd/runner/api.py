"""``tfhvd.run``: run a Python function on every rank of a new job and get
back each rank's return value, like ``horovod.run``.

::

    import tfhvd

    def train(lr):
        import tfhvd.tensorflow as hvd
        hvd.init()
        ...
        return hvd.rank(), final_loss

    results = tfhvd.run(train, args=(0.1,), num_proc=2)   # [(0, loss0), (1, loss1)]
"""

import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from tfhvd.runner import task
from tfhvd.runner.args import UsageError, merge_alias, parse_args
from tfhvd.runner.common import RunError, attach_payload  # noqa: F401  (re-exported)
from tfhvd.runner.hosts import HostError
from tfhvd.runner.launch import LaunchError, choose_gloo, job_env, prepare, run_gloo, run_job
from tfhvd.runner.output import FailureTracker, Line

class _Collector:
    """Takes the marked result lines out of the job's output."""

    def __init__(self) -> None:
        self.chunks: Dict[int, Dict[int, str]] = {}
        self.meta: Dict[int, Tuple[bool, int, int]] = {}  # rank -> (ok, count, crc)

    def __call__(self, line: Line) -> bool:
        if line.rank is None or not line.text.startswith(task.RESULT_MARKER):
            return False
        rank, ok, idx, count, crc, chunk = task.parse_line(line.text)
        self.chunks.setdefault(rank, {})[idx] = chunk
        self.meta[rank] = (ok, count, crc)
        return True

    def result(self, rank: int) -> Optional[Tuple[bool, Any]]:
        """``(ok, value)`` of a rank, or None when it sent nothing complete."""
        if rank not in self.meta:
            return None
        ok, count, crc = self.meta[rank]
        parts = self.chunks[rank]
        if len(parts) != count:
            return None
        import zlib

        data = "".join(parts[i] for i in range(count))
        if zlib.crc32(data.encode("ascii")) != crc:
            return None
        return ok, task.decode(data)


def _interfaces(network_interface: Optional[str],
                network_interfaces: Optional[Sequence[str]]) -> Optional[str]:
    """``--network-interface``'s value from ``horovod.run``'s two keywords:
    ``network_interfaces`` (a list of names; a comma-separated string is
    taken too) and the deprecated ``network_interface`` (a comma-separated
    string).  Both given must name the same interfaces."""
    if network_interface:
        warnings.warn("tfhvd.run(network_interface=...) is deprecated, as in Horovod: use "
                      "network_interfaces=[...]", DeprecationWarning, stacklevel=3)
    listed: Optional[List[str]] = None
    if network_interfaces:
        if isinstance(network_interfaces, str):
            listed = [n for n in network_interfaces.split(",") if n]
        else:
            listed = [str(n) for n in network_interfaces]
            bad = [n for n in listed if not n or "," in n]
            if bad:
                raise ValueError("tfhvd.run(): network_interfaces=%r: each entry is one "
                                 "interface name" % (list(network_interfaces),))
    if network_interface and listed is not None and \
            sorted(set(network_interface.split(","))) != sorted(set(listed)):
        raise ValueError("tfhvd.run(): network_interface=%r and network_interfaces=%r "
                         "disagree; give one" % (network_interface, list(network_interfaces or [])))
    if listed is not None:
        return ",".join(listed)
    return network_interface or None


def _launcher_argv(num_proc: int, hosts: Optional[str], hostfile: Optional[str],
                   options: Mapping[str, Any], command: Sequence[str]) -> List[str]:
    argv = ["-np", str(num_proc)]
    if hosts:
        argv += ["-H", hosts]
    if hostfile:
        argv += ["--hostfile", hostfile]
    flags = {"start_timeout": "--start-timeout", "ssh_port": "--ssh-port",
             "ssh_identity_file": "--ssh-identity-file",
             "network_interface": "--network-interface", "mpi_args": "--mpi-args",
             "output_filename": "--output-filename"}
    for key, flag in flags.items():
        if options.get(key) not in (None, ""):
            argv += [flag + "=" + str(options[key])]
    if options.get("disable_cache"):
        argv.append("--disable-cache")
    if options.get("verbose"):
        argv.append("--verbose")
    return argv + ["--"] + list(command)


def run(func: Callable[..., Any], args: Sequence[Any] = (),
        kwargs: Optional[Mapping[str, Any]] = None, num_proc: Optional[int] = None,
        min_num_proc: Optional[int] = None, max_num_proc: Optional[int] = None,
        slots: Optional[int] = None, reset_limit: Optional[int] = None,
        cooldown_range: Optional[Any] = None, hosts: Optional[str] = None,
        hostfile: Optional[str] = None, host_discovery_script: Optional[str] = None,
        start_timeout: Optional[int] = None,
        ssh_port: Optional[int] = None, ssh_identity_file: Optional[str] = None,
        disable_cache: Optional[bool] = None, output_filename: Optional[str] = None,
        verbose: Optional[bool] = None, use_gloo: Optional[bool] = None,
        use_mpi: Optional[bool] = None, mpi_args: Optional[str] = None,
        network_interface: Optional[str] = None,
        network_interfaces: Optional[Sequence[str]] = None, executable: Optional[str] = None,
        np: Optional[int] = None, min_np: Optional[int] = None, max_np: Optional[int] = None,
        *, env: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
        stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
        elastic_timeout: Optional[int] = None, **elastic: Any) -> List[Any]:
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` ranks (default 1) and
    returns the list of their return values, indexed by rank.

    The parameters are ``horovod.run``'s, with its names in its order
    (``np``, ``min_np`` and ``max_np`` are Horovod's older names for
    ``num_proc``, ``min_num_proc`` and ``max_num_proc``; giving both names
    with different values is an error).  ``func`` usually calls
    ``hvd.init()`` itself.  It, its arguments and its results travel
    pickled (with cloudpickle when installed, so functions defined in a
    script or a notebook work; otherwise ``func`` must be importable by
    module name on every host).  The others are ``tfhvdrun``'s flags:
    ``hosts="a:2,b:2"``, ``hostfile``, ``start_timeout``, ``ssh_port``,
    ``ssh_identity_file``, ``network_interfaces`` (a list of interface
    names, or Horovod's older ``network_interface="eth0,eth1"``, which
    warns ``DeprecationWarning`` as Horovod does), ``mpi_args``,
    ``output_filename``, ``verbose``, ``disable_cache``; ``executable`` is
    the Python to run on the ranks (default: this one).  ``use_gloo=True``
    runs the job without MPI (``tfhvdrun --gloo``), ``use_mpi=True`` under
    mpirun; neither: tfhvdrun's default.  ``min_num_proc``,
    ``max_num_proc``, ``slots``, ``reset_limit``, ``cooldown_range``,
    ``host_discovery_script`` (and tfhvd's keyword ``elastic_timeout``)
    make it an elastic job.

    tfhvd's own keyword-only arguments: ``env`` replaces the environment
    the ranks start from (default: this process's); after ``timeout``
    seconds the job is stopped; ``stdout``/``stderr`` receive the ranks'
    output.

    Raises :class:`RunError` naming the rank that failed first (its
    traceback in ``remote_traceback``), or ``ValueError`` for arguments that
    cannot run (bad host list, ``num_proc`` larger than the slots, no
    mpirun, unreachable host).
    """
    num_proc = merge_alias("num_proc", num_proc, "np", np)
    network_interface = _interfaces(network_interface, network_interfaces)
    num_proc = 1 if num_proc is None else num_proc
    elastic.update(min_num_proc=merge_alias("min_num_proc", min_num_proc, "min_np", min_np),
                   max_num_proc=merge_alias("max_num_proc", max_num_proc, "max_np", max_np),
                   slots=slots, reset_limit=reset_limit, cooldown_range=cooldown_range,
                   host_discovery_script=host_discovery_script,
                   elastic_timeout=elastic_timeout)
    if any(v is not None for v in elastic.values()):
        from tfhvd.runner.elastic.api import run_elastic_fn

        return run_elastic_fn(func, args, kwargs, num_proc=num_proc, hosts=hosts, env=env,
                              executable=executable, timeout=timeout, stdout=stdout,
                              stderr=stderr, verbose=bool(verbose), **elastic)
    if hosts is not None and hostfile is not None:
        raise ValueError("tfhvd.run(): give hosts or hostfile, not both")
    if use_gloo and use_mpi:
        raise ValueError("tfhvd.run(): give use_gloo=True or use_mpi=True, not both")
    if not callable(func):
        raise TypeError("tfhvd.run() needs a function, got %r" % (func,))
    base_env = dict(os.environ if env is None else env)
    payload_file = attach_payload(func, args, kwargs, base_env)
    command = [executable or sys.executable, "-m", "tfhvd.runner.task"]
    options = dict(start_timeout=start_timeout, ssh_port=ssh_port,
                   ssh_identity_file=ssh_identity_file, network_interface=network_interface,
                   mpi_args=mpi_args, output_filename=output_filename,
                   disable_cache=disable_cache, verbose=verbose)
    argv = _launcher_argv(num_proc, hosts, hostfile, options, command)
    if use_gloo or use_mpi:
        argv.insert(0, "--gloo" if use_gloo else "--mpi")
    try:
        try:
            parsed = parse_args(argv)
            gloo = choose_gloo(parsed, base_env) if use_gloo or not use_mpi else False
            if gloo:
                collector, tracker = _Collector(), FailureTracker()
                code = run_gloo(parsed, base_env, stdout=stdout, stderr=stderr,
                                on_line=collector, tracker=tracker, timeout=timeout)
                return _results(collector, tracker, num_proc, code)
            cmd = prepare(argv, base_env)
        except (UsageError, HostError) as e:
            raise ValueError("tfhvd.run(): %s" % e) from None
        except LaunchError as e:
            raise ValueError(str(e).replace("tfhvdrun: ", "tfhvd.run(): ", 1)) from None
        if verbose:
            print("tfhvd.run(): " + " ".join(cmd), file=stderr or sys.stderr, flush=True)
        collector = _Collector()
        tracker = FailureTracker()
        code = run_job(cmd, job_env(base_env, parsed), stdout=stdout, stderr=stderr,
                       on_line=collector, tracker=tracker, timeout=timeout,
                       output_dir=os.path.abspath(output_filename) if output_filename else None)
    finally:
        if payload_file:
            os.unlink(payload_file)
    return _results(collector, tracker, num_proc, code)


def _results(collector: _Collector, tracker: FailureTracker, num_proc: int,
             code: int) -> List[Any]:
    values: List[Any] = []
    failures: List[Tuple[int, Dict[str, str]]] = []
    missing: List[int] = []
    for rank in range(num_proc):
        r = collector.result(rank)
        if r is None:
            missing.append(rank)
        elif not r[0]:
            failures.append((rank, r[1]))
        else:
            values.append(r[1])
    if not failures and not missing and code == 0:
        return values
    culprit = tracker.culprit()
    first = culprit[0][0] if culprit else None
    if failures:
        # Prefer the rank the output shows failing first, among those that raised.
        rank, info = next(((r, i) for r, i in failures if r == first), failures[0])
        raise RunError("tfhvd.run(): rank %d raised %s: %s" % (rank, info["type"],
                                                                info["message"]),
                       rank=rank, exit_code=code or 1, remote_traceback=info["traceback"])
    if missing:
        why = " (rank %d %s)" % (first, culprit[1]) if culprit else ""
        raise RunError("tfhvd.run(): the job ended with exit code %d and rank%s %s sent no "
                       "result%s" % (code, "" if len(missing) == 1 else "s",
                                     ", ".join(map(str, missing)), why),
                       rank=first if first is not None else missing[0], exit_code=code)
    raise RunError("tfhvd.run(): every rank returned, but the job ended with exit code %d"
                   % code, exit_code=code)
