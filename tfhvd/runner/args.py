"""The command line of ``tfhvdrun``: Horovod's ``horovodrun`` flags.

Every flag keeps horovodrun's name and meaning, so a job script moves from
``horovodrun`` to ``tfhvdrun`` by changing the program name only.  Tuning
flags become ``TFHVD_*`` environment variables of the job (see
:func:`settings_env`), which the runtime reads at ``hvd.init()``.
"""

import argparse
import math
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from tfhvd.version import __version__

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")

DEFAULT_START_TIMEOUT = 30


class UsageError(ValueError):
    """A command line that cannot run; the message says what to change."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> "None":  # type: ignore[override]
        raise UsageError(message)


def _at_least(kind, minimum, what: str):
    """An argparse type: `kind(text)`, at least `minimum`, else a clear error."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError("expected %s, got %r" % (what, text)) from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError("expected a finite number, got %r" % (text,))
        if v < minimum:
            raise argparse.ArgumentTypeError("expected %s >= %s, got %r" % (what, minimum, text))
        return v
    parse.__name__ = kind.__name__
    return parse


_positive_int = _at_least(int, 1, "a whole number")


def _non_negative(kind):
    return _at_least(kind, 0, "a number")


class _JoinNics(argparse.Action):
    """``--network-interface(s)``: may be given several times (Horovod's
    form for several interfaces); the values join into one comma list."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        seen = [n for n in (getattr(namespace, self.dest, None) or "").split(",") if n]
        for name in str(values).split(","):
            name = name.strip()
            if name and name not in seen:
                seen.append(name)
        setattr(namespace, self.dest, ",".join(seen))


def _switch(group, on: Sequence[str], off: Sequence[str], dest: str, help_on: str,
            help_off: str = argparse.SUPPRESS, on_value: bool = True) -> None:
    """A Horovod on/off flag pair: ``dest`` is ``on_value`` with one of
    ``on``, ``not on_value`` with one of ``off``, None (unset: the job
    inherits the caller's environment) with neither; both is an error."""
    pair = group.add_mutually_exclusive_group()
    pair.add_argument(*on, dest=dest, action="store_const", const=on_value, default=None,
                      help=help_on)
    pair.add_argument(*off, dest=dest, action="store_const", const=not on_value,
                      default=None, help=help_off)


def make_parser() -> argparse.ArgumentParser:
    """The argument parser (errors raise :class:`UsageError`)."""
    p = _Parser(
        prog="tfhvdrun",
        description="Runs a tfhvd (Horovod-compatible) training job with mpirun, on this "
                    "machine or across hosts over ssh.",
        epilog="Example: tfhvdrun -np 4 -H hostA:2,hostB:2 python train.py",
        allow_abbrev=False,
    )
    p.add_argument("-v", "--version", action="version", version="tfhvd %s" % __version__)

    launch = p.add_argument_group("launch")
    launch.add_argument("-np", "--num-proc", dest="num_proc", type=_positive_int,
                        help="Number of processes (ranks) to start.")
    launch.add_argument("-H", "--hosts", dest="hosts",
                        help="Hosts and their slots: host1:2,host2:2 (default: localhost:NP).")
    launch.add_argument("-hostfile", "--hostfile", dest="hostfile",
                        help="File with one 'host slots=N' (or host:N) per line.")
    launch.add_argument("--start-timeout", dest="start_timeout", type=_positive_int,
                        default=None,
                        help="Seconds to wait for every host to answer over ssh before giving "
                             "up (default: $HOROVOD_START_TIMEOUT or %d)." % DEFAULT_START_TIMEOUT)
    launch.add_argument("--output-filename", dest="output_filename",
                        help="Also write each rank's output to DIR/rank.N/stdout and "
                             "DIR/rank.N/stderr.")
    launch.add_argument("--config-file", dest="config_file",
                        help="Horovod's YAML file of runtime settings (sections params, "
                             "autotune, timeline, stall_check, library_options, logging); "
                             "flags on the command line win over it.")

    controller = p.add_argument_group("controller")
    controller.add_argument("--mpi", dest="use_mpi", action="store_true",
                            help="Run the job with mpirun and the MPI backend (the default "
                                 "when mpirun is installed and the library has MPI).")
    controller.add_argument("--gloo", dest="use_gloo", action="store_true",
                            help="Run the job without MPI: tfhvdrun starts the ranks itself "
                                 "(locally or over ssh) and they meet through its rendezvous "
                                 "server over Gloo.")
    controller.add_argument("--jsrun", dest="use_jsrun", action="store_true",
                            help="Horovod's LSF launcher; tfhvd has none and runs the job "
                                 "with mpirun instead (with a warning).")

    elastic = p.add_argument_group("elastic")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_num_proc", type=_positive_int,
                         help="Elastic: fewest processes to keep training with (default -np).")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_num_proc", type=_positive_int,
                         help="Elastic: most processes to run (default: every slot found).")
    elastic.add_argument("--host-discovery-script", dest="host_discovery_script",
                         help="Elastic: a command that prints the available hosts, one "
                              "'host:slots' (or 'host') per line; run every second.")
    elastic.add_argument("--slots-per-host", "--slots", dest="slots", type=_positive_int,
                         help="Elastic: slots of a host the discovery script prints "
                              "without ':slots'.")
    elastic.add_argument("--reset-limit", dest="reset_limit", type=_non_negative(int),
                         help="Elastic: stop the job after this many resets.")
    elastic.add_argument("--blacklist-cooldown-range", dest="cooldown_range", nargs=2,
                         metavar=("LOW", "HIGH"),
                         help="Elastic: seconds; a blacklisted host may return after a "
                              "cooldown between them (default: never).")
    elastic.add_argument("--elastic-timeout", dest="elastic_timeout", type=_positive_int,
                         help="Elastic: seconds to wait for enough slots, and for workers to "
                              "reach a reset (default $HOROVOD_ELASTIC_TIMEOUT or 600).")

    ssh = p.add_argument_group("ssh")
    ssh.add_argument("-p", "--ssh-port", dest="ssh_port", type=_positive_int,
                     help="ssh port of the remote hosts.")
    ssh.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file",
                     help="ssh private key for the remote hosts.")
    ssh.add_argument("--network-interface", "--network-interfaces", dest="network_interface",
                     action=_JoinNics,
                     help="Network interface(s) for MPI and NCCL traffic, e.g. eth0 or "
                          "eth0,eth1 (or a subnet such as 10.0.0.0/24); may be repeated.")

    info = p.add_argument_group("information")
    info.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                      help="Print what this tfhvd build supports and exit.")
    info.add_argument("--verbose", dest="verbose", action="store_true",
                      help="Print the mpirun command before running it.")

    tuning = p.add_argument_group("tuning")
    tuning.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb",
                        type=_non_negative(float),
                        help="Fuse small allreduces into buffers of up to this many MB "
                             "(default 64; 0 disables fusion).")
    tuning.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=_non_negative(float),
                        help="Minimum time between negotiation rounds, in ms.")
    tuning.add_argument("--cache-capacity", dest="cache_capacity", type=_non_negative(int),
                        help="Entries of the response cache (0 disables it).")
    tuning.add_argument("--disable-cache", dest="disable_cache", action="store_true",
                        help="Same as --cache-capacity 0.")
    _switch(tuning, ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
            "hierarchical_allreduce",
            "GPU jobs: allreduce within each host over NCCL, then across hosts "
            "(TFHVD_HIERARCHICAL_ALLREDUCE); CPU jobs ignore it.",
            "Keep the flat allreduce (TFHVD_HIERARCHICAL_ALLREDUCE=0).")
    _switch(tuning, ["--hierarchical-allgather"], ["--no-hierarchical-allgather"],
            "hierarchical_allgather",
            "Accepted for Horovod; no effect (tfhvd's allgather is not hierarchical).",
            "Accepted for Horovod (tfhvd's allgather is never hierarchical).")
    _switch(tuning, ["--torus-allreduce"], ["--no-torus-allreduce"], "torus_allreduce",
            "Accepted for Horovod; no effect (tfhvd has no 2D torus allreduce: "
            "--hierarchical-allreduce is the two-level one).",
            "Accepted for Horovod (tfhvd's allreduce is never a torus).")

    autotune = p.add_argument_group("autotune (docs/autotune.md)")
    _switch(autotune, ["--autotune"], ["--no-autotune"], "autotune",
            "Tune the fusion threshold, cycle time and response cache while the job runs, "
            "and keep the best.")
    autotune.add_argument("--autotune-log-file", dest="autotune_log_file",
                          help="Rank 0 writes one CSV row per autotune sample to this file.")
    autotune.add_argument("--autotune-warmup-samples", dest="autotune_warmup_samples",
                          type=_non_negative(int),
                          help="Samples discarded before tuning starts (default 3).")
    autotune.add_argument("--autotune-steps-per-sample", dest="autotune_steps_per_sample",
                          type=_positive_int,
                          help="Training steps (approximately) per measurement window "
                               "(default 10).")
    autotune.add_argument("--autotune-bayes-opt-max-samples",
                          dest="autotune_bayes_opt_max_samples", type=_positive_int,
                          help="Samples of the Bayesian optimisation (default 20).")
    autotune.add_argument("--autotune-gaussian-process-noise",
                          dest="autotune_gaussian_process_noise", type=_non_negative(float),
                          help="Noise of the Gaussian process, for noisy scores "
                               "(default 0.8).")

    timeline = p.add_argument_group("timeline")
    timeline.add_argument("--timeline-filename", dest="timeline_filename",
                          help="Write a Chrome-trace timeline (open it in Perfetto) to this "
                               "file.")
    _switch(timeline, ["--timeline-mark-cycles"], ["--no-timeline-mark-cycles"],
            "timeline_mark_cycles", "Mark the background loop's cycles in the timeline.")

    stall = p.add_argument_group("stall check")
    _switch(stall, ["--no-stall-check"], ["--stall-check"], "no_stall_check",
            "Disable the stall check.")
    stall.add_argument("--stall-check-warning-time-seconds", dest="stall_check_warning_time",
                       type=_non_negative(float),
                       help="Warn when ranks disagree on a collective for this long "
                            "(default 60).")
    stall.add_argument("--stall-check-shutdown-time-seconds", dest="stall_check_shutdown_time",
                       type=_non_negative(float),
                       help="Fail the stalled collective (ending the job) after this long "
                            "(default 0: never).")

    library = p.add_argument_group("library")
    library.add_argument("--mpi-args", dest="mpi_args", default="",
                         help="Extra mpirun arguments, e.g. --mpi-args=\"--mca btl tcp,self\".")
    library.add_argument("--binding-args", dest="binding_args",
                         help="mpirun's process binding arguments, in place of tfhvdrun's "
                              "'--bind-to none --map-by slot', e.g. "
                              "--binding-args=\"--rankfile myrankfile\".")
    library.add_argument("--tcp", dest="tcp_flag", action="store_true",
                         help="TCP only: NCCL_IB_DISABLE=1 for every rank (MPI already runs "
                              "over ob1/TCP, never openib).")
    library.add_argument("--gloo-timeout-seconds", dest="gloo_timeout_seconds",
                         type=_positive_int,
                         help="Gloo rendezvous and collective timeout, in seconds "
                              "(TFHVD_GLOO_TIMEOUT_SECONDS; default: --start-timeout).")
    _switch(library, ["--mpi-threads-disable"], ["--no-mpi-threads-disable"],
            "mpi_threads_disable",
            "Accepted for Horovod; no effect (tfhvd asks MPI for MPI_THREAD_MULTIPLE).")
    library.add_argument("--num-nccl-streams", dest="num_nccl_streams",
                         type=_non_negative(int),
                         help="Accepted for Horovod; no effect (one NCCL stream per process).")
    library.add_argument("--thread-affinity", dest="thread_affinity", type=_non_negative(int),
                         help="Accepted for Horovod; no effect (tfhvd does not pin its "
                              "background thread).")
    library.add_argument("--ccl-bgt-affinity", dest="ccl_bgt_affinity",
                         type=_non_negative(int),
                         help="Accepted for Horovod; no effect (tfhvd has no oneCCL backend).")

    logs = p.add_argument_group("logging")
    logs.add_argument("--log-level", dest="log_level", type=str.upper, choices=LOG_LEVELS,
                      help="Runtime log level (TFHVD_LOG_LEVEL).")
    stamp = logs.add_mutually_exclusive_group()
    stamp.add_argument("--log-with-timestamp", "--no-log-hide-timestamp",
                       dest="log_with_timestamp", action="store_const", const=True,
                       default=None,
                       help="Accepted for Horovod; no effect (tfhvd's log lines have no "
                            "timestamp: see --prefix-output-with-timestamp).")
    stamp.add_argument("--log-without-timestamp", "--log-hide-timestamp",
                       dest="log_with_timestamp", action="store_const", const=False,
                       help="Accepted for Horovod (tfhvd's log lines never have a timestamp).")
    logs.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                      dest="prefix_output_with_timestamp", action="store_true",
                      help="Start every output line with the time it arrived.")

    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="The program to run on every rank, with its arguments.")
    return p


# Flags that tfhvd accepts for Horovod but that change nothing: the setting
# (dest, value that has no effect) -> the flag and why.
_NO_EFFECT = [
    ("hierarchical_allgather", True, "--hierarchical-allgather",
     "tfhvd's allgather is not hierarchical"),
    ("torus_allreduce", True, "--torus-allreduce",
     "tfhvd has no 2D torus allreduce (--hierarchical-allreduce is its two-level one)"),
    ("mpi_threads_disable", True, "--mpi-threads-disable",
     "tfhvd always asks MPI for MPI_THREAD_MULTIPLE"),
    ("num_nccl_streams", None, "--num-nccl-streams",
     "tfhvd runs one NCCL stream per process"),
    ("thread_affinity", None, "--thread-affinity", "tfhvd does not pin its background thread"),
    ("ccl_bgt_affinity", None, "--ccl-bgt-affinity", "tfhvd has no oneCCL backend"),
    ("log_with_timestamp", True, "--log-with-timestamp",
     "tfhvd's log lines have no timestamp (--prefix-output-with-timestamp stamps every "
     "output line)"),
]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses and checks a ``tfhvdrun`` command line.

    Raises :class:`UsageError` for anything that cannot run, before any
    process is started.  ``args.warnings`` holds one line for each flag that
    is accepted but has no effect in tfhvd (:func:`main` prints them).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    args.warnings = []
    args.from_config = set()
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.config_file:
        apply_config(args, read_config(args.config_file), _given(argv))
    controllers = [f for f, on in (("--gloo", args.use_gloo), ("--mpi", args.use_mpi),
                                   ("--jsrun", args.use_jsrun)) if on]
    if len(controllers) > 1:
        raise UsageError("give %s, not both" % " or ".join(controllers))
    if args.check_build:
        return args
    if args.hosts and args.hostfile:
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if not args.command:
        raise UsageError("no command given: tfhvdrun -np N [options] python train.py")
    if is_elastic(args):
        _check_elastic(args)
    elif args.num_proc is None:
        raise UsageError("-np/--num-proc is required (the number of processes to start)")
    if args.ssh_identity_file and not os.path.isfile(args.ssh_identity_file):
        raise UsageError("-i/--ssh-identity-file %s: no such file" % args.ssh_identity_file)
    split_mpi_args(args.binding_args or "", "--binding-args")
    _collect_warnings(args)
    return args


def _collect_warnings(args: argparse.Namespace) -> None:
    def warn(flag: str, dest: str, why: str) -> None:
        where = " (from --config-file)" if dest in args.from_config else ""
        args.warnings.append("tfhvdrun: warning: %s%s has no effect: %s" % (flag, where, why))

    for dest, value, flag, why in _NO_EFFECT:
        v = getattr(args, dest)
        if v is not None and (value is None or v == value):
            warn(flag, dest, why)
    if args.use_jsrun:
        args.use_mpi = True
        args.warnings.append("tfhvdrun: warning: --jsrun: tfhvd has no jsrun launcher; the "
                             "job runs with mpirun (the MPI controller) instead")
    if args.binding_args and is_elastic(args):
        warn("--binding-args", "binding_args", "an elastic job runs without mpirun")


def _given(argv: Sequence[str]) -> Set[str]:
    """The destinations that ``argv`` sets itself (they win over --config-file)."""
    p = make_parser()
    for action in p._actions:  # argparse offers no public way to drop every default
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(list(argv))))


def _yaml_bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError("expected true or false, got %r" % (text,))


def _level(text: Any) -> str:
    level = str(text).upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError("expected one of %s, got %r"
                                         % (", ".join(LOG_LEVELS), text))
    return level


# Horovod's config file: section -> key -> (destination, parse).  The
# sections' "enabled" keys of autotune and stall_check are handled apart.
_CONFIG: Dict[str, Dict[str, Tuple[str, Callable[[Any], Any]]]] = {
    "params": {
        "fusion_threshold_mb": ("fusion_threshold_mb", _non_negative(float)),
        "cycle_time_ms": ("cycle_time_ms", _non_negative(float)),
        "cache_capacity": ("cache_capacity", _non_negative(int)),
        "hierarchical_allreduce": ("hierarchical_allreduce", _yaml_bool),
        "hierarchical_allgather": ("hierarchical_allgather", _yaml_bool),
        "torus_allreduce": ("torus_allreduce", _yaml_bool),
    },
    "autotune": {
        "enabled": ("autotune", _yaml_bool),
        "log_file": ("autotune_log_file", str),
        "warmup_samples": ("autotune_warmup_samples", _non_negative(int)),
        "steps_per_sample": ("autotune_steps_per_sample", _positive_int),
        "bayes_opt_max_samples": ("autotune_bayes_opt_max_samples", _positive_int),
        "gaussian_process_noise": ("autotune_gaussian_process_noise", _non_negative(float)),
    },
    "timeline": {
        "filename": ("timeline_filename", str),
        "mark_cycles": ("timeline_mark_cycles", _yaml_bool),
    },
    "stall_check": {
        "enabled": ("no_stall_check", lambda v: not _yaml_bool(v)),
        "warning_time_seconds": ("stall_check_warning_time", _non_negative(float)),
        "shutdown_time_seconds": ("stall_check_shutdown_time", _non_negative(float)),
    },
    "library_options": {
        "mpi_threads_disable": ("mpi_threads_disable", _yaml_bool),
        "num_nccl_streams": ("num_nccl_streams", _non_negative(int)),
        "thread_affinity": ("thread_affinity", _non_negative(int)),
        "ccl_bgt_affinity": ("ccl_bgt_affinity", _non_negative(int)),
        "gloo_timeout_seconds": ("gloo_timeout_seconds", _positive_int),
    },
    "logging": {
        "level": ("log_level", _level),
        "with_timestamp": ("log_with_timestamp", _yaml_bool),
    },
}


def read_config(path: str) -> Dict[str, Any]:
    """The mapping in Horovod's YAML config file ``path`` (empty file: {})."""
    try:
        import yaml
    except ImportError:
        raise UsageError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise UsageError("--config-file %s: cannot read it (%s)" % (path, e.strerror)) from None
    except yaml.YAMLError as e:
        raise UsageError("--config-file %s: not valid YAML: %s" % (path, e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError("--config-file %s: expected a mapping of sections (params:, "
                         "autotune:, ...), got %s" % (path, type(data).__name__))
    return data


def apply_config(args: argparse.Namespace, config: Mapping[str, Any],
                 given: Set[str]) -> None:
    """Sets the settings of Horovod's config file on ``args``, except those
    the command line gave (``given``: destinations).  Unknown keys are
    skipped with a warning; bad values raise :class:`UsageError`."""
    path = args.config_file
    for section, body in config.items():
        if section == "controller":
            _config_controller(args, path, body)
            continue
        keys = _CONFIG.get(section)
        if keys is None:
            args.warnings.append("tfhvdrun: warning: --config-file %s: unknown section %r "
                                 "ignored" % (path, section))
            continue
        if body is None:
            continue
        if not isinstance(body, dict):
            raise UsageError("--config-file %s: section %r must be a mapping of keys"
                             % (path, section))
        for key, value in body.items():
            if key not in keys:
                args.warnings.append("tfhvdrun: warning: --config-file %s: unknown key "
                                     "%s.%s ignored" % (path, section, key))
                continue
            dest, parse = keys[key]
            if dest in given or value is None:
                continue
            try:
                setattr(args, dest, parse(value))
            except (argparse.ArgumentTypeError, ValueError) as e:
                raise UsageError("--config-file %s: %s.%s: %s" % (path, section, key, e)) \
                    from None
            args.from_config.add(dest)


def _config_controller(args: argparse.Namespace, path: str, value: Any) -> None:
    if args.use_gloo or args.use_mpi or args.use_jsrun or value is None:
        return
    name = str(value).lower()
    if name not in ("gloo", "mpi"):
        raise UsageError("--config-file %s: controller: expected gloo or mpi, got %r"
                         % (path, value))
    setattr(args, "use_" + name, True)


def merge_alias(name: str, value: Any, old_name: str, old_value: Any) -> Any:
    """A keyword and Horovod's older name for it (``num_proc`` and ``np``):
    whichever is given, or None; both with different values is an error."""
    if value is not None and old_value is not None and value != old_value:
        raise ValueError("tfhvd.run(): %s=%r and %s=%r disagree; give only %s (%s is "
                         "Horovod's older name for it)" % (name, value, old_name, old_value,
                                                           name, old_name))
    return value if value is not None else old_value


def is_elastic(args: argparse.Namespace) -> bool:
    """Whether the command line asks for an elastic job."""
    return bool(args.host_discovery_script or args.min_num_proc or args.max_num_proc)


def _check_elastic(args: argparse.Namespace) -> None:
    if args.hostfile:
        raise UsageError("an elastic job takes its hosts from --host-discovery-script or -H, "
                         "not --hostfile")
    if args.hosts and args.host_discovery_script:
        raise UsageError("give either -H/--hosts or --host-discovery-script, not both")
    if args.num_proc is None:
        args.num_proc = args.min_num_proc or 1
    if args.min_num_proc is None:
        args.min_num_proc = args.num_proc
    if args.min_num_proc > args.num_proc:
        raise UsageError("--min-np %d is larger than -np %d" % (args.min_num_proc,
                                                                args.num_proc))
    if args.max_num_proc is not None and args.max_num_proc < args.num_proc:
        raise UsageError("--max-np %d is smaller than -np %d" % (args.max_num_proc,
                                                                 args.num_proc))
    if args.cooldown_range is not None:
        from tfhvd.runner.elastic.discovery import parse_cooldown_range

        try:
            args.cooldown_range = parse_cooldown_range(",".join(args.cooldown_range))
        except ValueError as e:
            raise UsageError(str(e)) from None


def elastic_timeout(args: argparse.Namespace, env: Dict[str, str]) -> float:
    """``--elastic-timeout``, else ``$TFHVD_ELASTIC_TIMEOUT``/``$HOROVOD_ELASTIC_TIMEOUT``,
    else 600 s."""
    if args.elastic_timeout is not None:
        return float(args.elastic_timeout)
    for name in ("TFHVD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"):
        if env.get(name):
            try:
                return float(_positive_int(env[name]))
            except argparse.ArgumentTypeError as e:
                raise UsageError("%s: %s" % (name, e)) from None
    return 600.0


def settings_env(args: argparse.Namespace) -> Dict[str, str]:
    """The variables that the tuning, timeline, stall, library and log flags
    (and ``--config-file``) set for every rank: ``TFHVD_*`` names, which the
    runtime reads before the ``HOROVOD_*`` ones, and ``NCCL_IB_DISABLE`` for
    ``--tcp``.  Flags win over the caller's environment; an on/off flag left
    out leaves the environment's value alone."""
    out: Dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        out["TFHVD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        out["TFHVD_CYCLE_TIME"] = _num(args.cycle_time_ms)
    if args.disable_cache:
        out["TFHVD_CACHE_CAPACITY"] = "0"
    elif args.cache_capacity is not None:
        out["TFHVD_CACHE_CAPACITY"] = str(args.cache_capacity)
    _switch_env(out, "TFHVD_HIERARCHICAL_ALLREDUCE", args.hierarchical_allreduce)
    if args.log_level:
        out["TFHVD_LOG_LEVEL"] = args.log_level.lower()
    out.update(_autotune_env(args))
    if args.timeline_filename:
        out["TFHVD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    _switch_env(out, "TFHVD_TIMELINE_MARK_CYCLES", args.timeline_mark_cycles)
    if args.stall_check_warning_time is not None:
        out["TFHVD_STALL_CHECK_TIME_SECONDS"] = _num(args.stall_check_warning_time)
    if args.stall_check_shutdown_time is not None:
        out["TFHVD_STALL_SHUTDOWN_TIME_SECONDS"] = _num(args.stall_check_shutdown_time)
    _switch_env(out, "TFHVD_STALL_CHECK_DISABLE", args.no_stall_check)
    if args.gloo_timeout_seconds is not None:
        out["TFHVD_GLOO_TIMEOUT_SECONDS"] = str(args.gloo_timeout_seconds)
    if args.tcp_flag:
        out["NCCL_IB_DISABLE"] = "1"  # NCCL over sockets, as horovodrun --tcp
    return out


def _switch_env(out: Dict[str, str], name: str, value: Optional[bool]) -> None:
    """An on/off flag: ``1``/``0`` when given, nothing when not."""
    if value is not None:
        out[name] = "1" if value else "0"


def _autotune_env(args: argparse.Namespace) -> Dict[str, str]:
    out: Dict[str, str] = {}
    _switch_env(out, "TFHVD_AUTOTUNE", getattr(args, "autotune", None))
    if getattr(args, "autotune_log_file", None):
        out["TFHVD_AUTOTUNE_LOG"] = os.path.abspath(args.autotune_log_file)
    for flag, var in (("autotune_warmup_samples", "WARMUP_SAMPLES"),
                      ("autotune_steps_per_sample", "STEPS_PER_SAMPLE"),
                      ("autotune_bayes_opt_max_samples", "BAYES_OPT_MAX_SAMPLES"),
                      ("autotune_gaussian_process_noise", "GAUSSIAN_PROCESS_NOISE")):
        value = getattr(args, flag, None)
        if value is not None:
            out["TFHVD_AUTOTUNE_" + var] = _num(value)
    return out


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def start_timeout(args: argparse.Namespace, env: Dict[str, str]) -> int:
    """``--start-timeout``, else ``$HOROVOD_START_TIMEOUT``/``$TFHVD_START_TIMEOUT``,
    else 30 s."""
    if args.start_timeout is not None:
        return args.start_timeout
    for name in ("TFHVD_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        if env.get(name):
            try:
                return _positive_int(env[name])
            except argparse.ArgumentTypeError as e:
                raise UsageError("%s: %s" % (name, e)) from None
    return DEFAULT_START_TIMEOUT


def split_mpi_args(text: Optional[str], flag: str = "--mpi-args") -> List[str]:
    """``--mpi-args`` (or another flag's mpirun arguments) as a list (shell
    quoting rules)."""
    import shlex

    try:
        return shlex.split(text or "")
    except ValueError as e:
        raise UsageError("%s %r: %s" % (flag, text, e)) from None
