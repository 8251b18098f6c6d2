"""``tfhvd.run(func, ..., min_num_proc=, max_num_proc=, host_discovery_script=)``: a function
run as an elastic job, as ``horovod.run`` takes it.

The function travels as for a plain :func:`tfhvd.run` (pickled, run by
:mod:`tfhvd.runner.task`); the job is an :class:`~tfhvd.runner.elastic.launch.ElasticJob`.
The result is the list of return values of the workers of the last world, by
their rank in it.
"""

import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO

from tfhvd.runner import task
from tfhvd.runner.args import UsageError, merge_alias, parse_args
from tfhvd.runner.common import RunError, attach_payload

# tfhvd.run keyword -> tfhvdrun flag (Horovod's names, and their long forms).
_FLAGS = {"min_np": "--min-np", "min_num_proc": "--min-np", "max_np": "--max-np",
          "max_num_proc": "--max-np", "host_discovery_script": "--host-discovery-script",
          "slots": "--slots-per-host", "slots_per_host": "--slots-per-host",
          "reset_limit": "--reset-limit", "cooldown_range": "--blacklist-cooldown-range",
          "elastic_timeout": "--elastic-timeout"}


def elastic_argv(num_proc: int, hosts: Optional[str], elastic: Mapping[str, Any],
                 command: Sequence[str]) -> List[str]:
    """The ``tfhvdrun`` command line for an elastic :func:`tfhvd.run` call
    (``elastic``: its elastic keywords; an unknown one is a ``TypeError``)."""
    unknown = sorted(k for k in elastic if k not in _FLAGS)
    if unknown:
        raise TypeError("tfhvd.run() got unexpected keyword argument%s %s"
                        % ("" if len(unknown) == 1 else "s", ", ".join(unknown)))
    argv = ["-np", str(num_proc)]
    if hosts:
        argv += ["-H", hosts]
    given: Dict[str, Any] = {}
    for key, value in elastic.items():
        if value is None:
            continue
        flag = _FLAGS[key]
        if flag in given:  # a keyword and its other name: equal, or a ValueError
            new, old = sorted([given[flag], (key, value)], key=lambda kv: kv[0].endswith("_np"))
            merge_alias(new[0], new[1], old[0], old[1])
        given[flag] = (key, value)
    for flag, (key, value) in given.items():
        if key == "cooldown_range":
            low, high = value.split(",") if isinstance(value, str) else value
            argv += [flag, str(low), str(high)]
            continue
        argv += [flag, str(value)]
    return argv + ["--"] + list(command)


def run_elastic_fn(fn: Callable[..., Any], args: Sequence[Any] = (),
                   kwargs: Optional[Mapping[str, Any]] = None, num_proc: Optional[int] = None,
                   hosts: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                   executable: Optional[str] = None, timeout: Optional[float] = None,
                   stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
                   verbose: bool = False, np: Optional[int] = None,
                   **elastic: Any) -> List[Any]:
    """See the module docstring; raises ``RunError`` when the job fails.
    ``np`` is Horovod's older name for ``num_proc`` (default 1)."""
    from tfhvd.runner.elastic.launch import ElasticJob

    command = [executable or sys.executable, "-m", "tfhvd.runner.task"]
    try:
        num_proc = merge_alias("num_proc", num_proc, "np", np)
        parsed = parse_args(elastic_argv(1 if num_proc is None else num_proc, hosts, elastic,
                                         command))
    except UsageError as e:
        raise ValueError("tfhvd.run(): %s" % e) from None
    base_env: Dict[str, str] = dict(os.environ if env is None else env)
    payload_file = attach_payload(fn, args, kwargs, base_env)
    results: Dict[str, Any] = {}  # worker -> (ok, value)
    chunks: Dict[str, Dict[int, str]] = {}

    def on_line(wid: str, stream: str, text: str) -> bool:
        if stream != "stdout" or not text.startswith(task.RESULT_MARKER):
            return False
        _rank, ok, idx, count, _crc, chunk = task.parse_line(text)
        parts = chunks.setdefault(wid, {})
        parts[idx] = chunk
        if len(parts) == count:
            results[wid] = (ok, task.decode("".join(parts[i] for i in range(count))))
        return True

    try:
        job = ElasticJob(parsed, base_env, stdout=stdout, stderr=stderr, on_line=on_line)
        code = job.run(timeout=timeout)
    finally:
        if payload_file:
            os.unlink(payload_file)
    failures = [(w, v) for w, (ok, v) in sorted(results.items()) if not ok]
    if code != 0:
        if failures:
            wid, info = failures[0]
            raise RunError("tfhvd.run(): elastic job failed; worker %s raised %s: %s"
                           % (wid, info["type"], info["message"]), exit_code=code,
                           remote_traceback=info["traceback"])
        raise RunError("tfhvd.run(): elastic job failed with exit code %d (%s)"
                       % (code, job.driver.error), exit_code=code)
    members = job.driver.world.members if job.driver.world else []
    missing = [w for w in members if not results.get(w, (False,))[0]]
    if missing:
        raise RunError("tfhvd.run(): worker%s %s of the last world sent no result"
                       % ("" if len(missing) == 1 else "s", ", ".join(missing)), exit_code=code)
    return [results[w][1] for w in members]
