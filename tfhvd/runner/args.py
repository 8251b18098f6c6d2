"""The command line of ``tfhvdrun``: Horovod's ``horovodrun`` flags.

Every flag keeps horovodrun's name and meaning, so a job script moves from
``horovodrun`` to ``tfhvdrun`` by changing the program name only.  Tuning
flags become ``TFHVD_*`` environment variables of the job (see
:func:`settings_env`), which the runtime reads at ``hvd.init()``.
"""

import argparse
import os
from typing import Dict, List, Optional, Sequence

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
        if v < minimum:
            raise argparse.ArgumentTypeError("expected %s >= %s, got %r" % (what, minimum, text))
        return v
    parse.__name__ = kind.__name__
    return parse


_positive_int = _at_least(int, 1, "a whole number")


def _non_negative(kind):
    return _at_least(kind, 0, "a number")


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
    launch.add_argument("--mpi-args", dest="mpi_args", default="",
                        help="Extra mpirun arguments, e.g. --mpi-args=\"--mca btl tcp,self\".")
    launch.add_argument("--mpi", dest="use_mpi", action="store_true",
                        help="Run the job with mpirun and the MPI backend (the default when "
                             "mpirun is installed and the library has MPI).")
    launch.add_argument("--gloo", dest="use_gloo", action="store_true",
                        help="Run the job without MPI: tfhvdrun starts the ranks itself "
                             "(locally or over ssh) and they meet through its rendezvous "
                             "server over Gloo.")

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
                     help="Network interface(s) for MPI and NCCL traffic, e.g. eth0 or "
                          "eth0,eth1 (or a subnet such as 10.0.0.0/24).")

    info = p.add_argument_group("information")
    info.add_argument("-cb", "--check-build", dest="check_build", action="store_true",
                      help="Print what this tfhvd build supports and exit.")
    info.add_argument("--verbose", dest="verbose", action="store_true",
                      help="Print the mpirun command before running it.")
    info.add_argument("--log-level", dest="log_level", type=str.upper, choices=LOG_LEVELS,
                      help="Runtime log level (TFHVD_LOG_LEVEL).")

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

    autotune = p.add_argument_group("autotune (docs/autotune.md)")
    autotune.add_argument("--autotune", dest="autotune", action="store_true",
                          help="Tune the fusion threshold, cycle time and response cache "
                               "while the job runs, and keep the best.")
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
    timeline.add_argument("--timeline-mark-cycles", dest="timeline_mark_cycles",
                          action="store_true",
                          help="Mark the background loop's cycles in the timeline.")

    stall = p.add_argument_group("stall check")
    stall.add_argument("--stall-check-warning-time-seconds", dest="stall_check_warning_time",
                       type=_non_negative(float),
                       help="Warn when ranks disagree on a collective for this long "
                            "(default 60).")
    stall.add_argument("--stall-check-shutdown-time-seconds", dest="stall_check_shutdown_time",
                       type=_non_negative(float),
                       help="Fail the stalled collective (ending the job) after this long "
                            "(default 0: never).")
    stall.add_argument("--no-stall-check", dest="no_stall_check", action="store_true",
                       help="Disable the stall check.")

    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="The program to run on every rank, with its arguments.")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses and checks a ``tfhvdrun`` command line.

    Raises :class:`UsageError` for anything that cannot run, before any
    process is started.
    """
    args = make_parser().parse_args(list(argv) if argv is not None else None)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.use_gloo and args.use_mpi:
        raise UsageError("give --gloo or --mpi, not both")
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
    return args


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
    """The ``TFHVD_*`` variables that the tuning, timeline, stall and log
    flags set for every rank (flags win over the caller's environment)."""
    out: Dict[str, str] = {}
    if args.fusion_threshold_mb is not None:
        out["TFHVD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        out["TFHVD_CYCLE_TIME"] = _num(args.cycle_time_ms)
    if args.disable_cache:
        out["TFHVD_CACHE_CAPACITY"] = "0"
    elif args.cache_capacity is not None:
        out["TFHVD_CACHE_CAPACITY"] = str(args.cache_capacity)
    if args.log_level:
        out["TFHVD_LOG_LEVEL"] = args.log_level.lower()
    out.update(_autotune_env(args))
    if args.timeline_filename:
        out["TFHVD_TIMELINE"] = os.path.abspath(args.timeline_filename)
    if args.timeline_mark_cycles:
        out["TFHVD_TIMELINE_MARK_CYCLES"] = "1"
    if args.stall_check_warning_time is not None:
        out["TFHVD_STALL_CHECK_TIME_SECONDS"] = _num(args.stall_check_warning_time)
    if args.stall_check_shutdown_time is not None:
        out["TFHVD_STALL_SHUTDOWN_TIME_SECONDS"] = _num(args.stall_check_shutdown_time)
    if args.no_stall_check:
        out["TFHVD_STALL_CHECK_DISABLE"] = "1"
    return out


def _autotune_env(args: argparse.Namespace) -> Dict[str, str]:
    out: Dict[str, str] = {}
    if getattr(args, "autotune", False):
        out["TFHVD_AUTOTUNE"] = "1"
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


def split_mpi_args(text: str) -> List[str]:
    """``--mpi-args`` as a list (shell quoting rules)."""
    import shlex

    try:
        return shlex.split(text or "")
    except ValueError as e:
        raise UsageError("--mpi-args %r: %s" % (text, e)) from None
