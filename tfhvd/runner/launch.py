"""``tfhvdrun``: builds the mpirun command line, checks it can run, runs it.

The command line is built by :func:`build_mpirun_command`, a pure function of
the parsed arguments and an environment, so tests can look at exactly what
would run without starting anything.  :func:`main` adds the checks that need
the world (mpirun on PATH, the script exists, every host answers over ssh
within ``--start-timeout``) and then runs mpirun with :func:`run_job`, which
passes its output through, ends with mpirun's (the job's) exit code, and on
failure prints which rank failed first.
"""

import argparse
import io
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from tfhvd.runner import hosts as hostlib
from tfhvd.runner.args import (UsageError, is_elastic, parse_args, settings_env,
                               split_mpi_args, start_timeout)
from tfhvd.runner.common import (  # noqa: F401  (LaunchError and the codes re-exported)
    EXIT_NO_MPIRUN, EXIT_UNREACHABLE, EXIT_USAGE, LaunchError,
    forwarded_env, plan_slots, set_pdeathsig)
from tfhvd.runner.hosts import HostError, HostSlots
from tfhvd.runner.output import Demux, FailureTracker, Line, LineSink

# mpirun options that take a value, to tell the user's choices in --mpi-args.
_BINDING_OPTS = ("--bind-to", "-bind-to")
_MAPPING_OPTS = ("--map-by", "-map-by")

MPI_INSTALL_HINT = (
    "Install Open MPI, e.g. on Debian/Ubuntu: sudo apt-get install -y openmpi-bin "
    "libopenmpi-dev (or run `make setup` in the tfhvd source tree), then make sure "
    "`mpirun` is on PATH.")

def resolve_hosts(args: argparse.Namespace) -> List[HostSlots]:
    """The job's hosts from ``-H``, ``--hostfile`` or the default
    (``localhost:NP``); raises :class:`HostError` when ``-np`` does not fit."""
    if args.hosts:
        hosts = hostlib.parse_hosts(args.hosts)
        source = "-H %s" % args.hosts
    elif args.hostfile:
        hosts = hostlib.parse_hostfile(args.hostfile)
        source = "--hostfile %s" % args.hostfile
    else:
        return hostlib.default_hosts(args.num_proc)
    slots = hostlib.total_slots(hosts)
    if args.num_proc > slots:
        raise HostError(
            "-np %d is larger than the %d slot%s of %s; lower -np or give the hosts more "
            "slots (host:slots)" % (args.num_proc, slots, "" if slots == 1 else "s", source))
    return hosts


def _has_option(mpi_args: Sequence[str], names: Sequence[str]) -> bool:
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in mpi_args)


def _has_mca(mpi_args: Sequence[str], param: str) -> bool:
    for i, a in enumerate(mpi_args[:-1]):
        if a in ("--mca", "-mca", "--gmca", "-gmca") and mpi_args[i + 1] == param:
            return True
    return False


def build_mpirun_command(args: argparse.Namespace, env: Mapping[str, str],
                         mpirun: str = "mpirun", uid: Optional[int] = None) -> List[str]:
    """The mpirun command line for a parsed ``tfhvdrun`` command line.

    Pure: it reads only its arguments (``uid`` defaults to this process's
    effective uid).  The result:

    * ``--allow-run-as-root`` when run as root (mpirun refuses otherwise);
    * ``--tag-output`` so every line says which rank wrote it;
    * ``-np N -H host:slots,...`` (``localhost:N`` without ``-H``), so the
      slot count, not the core count, decides how many ranks fit;
    * ``--bind-to none --map-by slot``: TensorFlow sizes its thread pools to
      the machine, so a rank pinned to one core (mpirun's default for
      ``-np`` <= 2) would run several times slower; ``--binding-args``
      replaces both;
    * ``--mca pml ob1 --mca btl ^openib``: the byte-transfer layers that
      ``--network-interface`` steers (UCX would pick interfaces itself);
    * ssh port and key as ``plm_rsh_args``; ``--network-interface`` as
      ``btl_tcp_if_include`` and ``oob_tcp_if_include``, and for interface
      names also NCCL_SOCKET_IFNAME and TFHVD_SOCKET_IFNAME;
    * ``-x NAME`` for every forwarded variable (PATH, LD_LIBRARY_PATH,
      PYTHONPATH, TFHVD_*, HOROVOD_*, NCCL_*, TF_*) and ``-x NAME=VALUE`` for
      the settings the flags make (``--tcp``: ``NCCL_IB_DISABLE=1``; Open MPI
      itself already runs over ob1's TCP, as horovodrun leaves it);
    * then ``--mpi-args`` (each default above is left out when ``--mpi-args``
      sets the same option) and the command.

    ``--output-filename`` is not mpirun's: :func:`run_job` writes each rank's
    reassembled lines to ``DIR/rank.N/stdout`` and ``stderr`` itself, so the
    files are clean (mpirun's would carry the tags, split mid-line).
    """
    mpi_args = split_mpi_args(args.mpi_args)
    uid = os.geteuid() if uid is None else uid
    cmd = [mpirun]
    if uid == 0:
        cmd.append("--allow-run-as-root")
    cmd.append("--tag-output")
    hosts = resolve_hosts(args)
    cmd += ["-np", str(args.num_proc), "-H", hostlib.format_hosts(hosts)]
    if args.binding_args:
        # horovodrun --binding-args: the user's binding in place of tfhvdrun's.
        cmd += split_mpi_args(args.binding_args, "--binding-args")
    else:
        if not _has_option(mpi_args, _BINDING_OPTS):
            cmd += ["--bind-to", "none"]
        if not _has_option(mpi_args, _MAPPING_OPTS):
            cmd += ["--map-by", "slot"]
    if not _has_mca(mpi_args, "pml"):
        cmd += ["--mca", "pml", "ob1"]
    if not _has_mca(mpi_args, "btl"):
        cmd += ["--mca", "btl", "^openib"]
    rsh = []
    if args.ssh_port is not None:
        rsh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        rsh += ["-i", os.path.abspath(args.ssh_identity_file)]
    if rsh:
        cmd += ["--mca", "plm_rsh_args", " ".join(shlex.quote(x) for x in rsh)]
    extra_env: Dict[str, str] = {}
    if args.network_interface:
        nics = args.network_interface
        cmd += ["--mca", "btl_tcp_if_include", nics, "--mca", "oob_tcp_if_include", nics]
        if "/" not in nics:  # these take interface names, not subnets
            extra_env["NCCL_SOCKET_IFNAME"] = nics
            extra_env["TFHVD_SOCKET_IFNAME"] = nics  # the runtime's control sockets
    extra_env.update(settings_env(args))
    for name in forwarded_env(env):
        if name not in extra_env:
            cmd += ["-x", name]
    for name, value in sorted(extra_env.items()):
        cmd += ["-x", "%s=%s" % (name, value)]
    cmd += mpi_args
    cmd += list(args.command)
    return cmd


def find_mpirun(env: Mapping[str, str]) -> str:
    """Path of mpirun on the launcher's PATH, or :class:`LaunchError` saying
    how to install it."""
    path = shutil.which("mpirun", path=hostlib.env_path(env))
    if path is None:
        raise LaunchError("tfhvdrun: mpirun was not found on PATH. " + MPI_INSTALL_HINT,
                          EXIT_NO_MPIRUN)
    return path


def check_program(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Fails early when the program, or the script given to a Python
    interpreter, does not exist here (mpirun would report it per rank)."""
    prog = command[0]
    if os.sep in prog:
        found = prog if os.path.isfile(prog) and os.access(prog, os.X_OK) else None
    else:
        found = shutil.which(prog, path=hostlib.env_path(env))
    if found is None:
        raise LaunchError("tfhvdrun: program %r not found%s" % (
            prog, "" if os.sep in prog else " on PATH"))
    name = os.path.basename(prog)
    if name.startswith("python") and len(command) > 1:
        script = command[1]
        if not script.startswith("-") and not os.path.isfile(script):
            raise LaunchError("tfhvdrun: script %r does not exist (working directory %s)"
                              % (script, os.getcwd()))


def check_hosts(args: argparse.Namespace, hosts: Sequence[HostSlots],
                env: Mapping[str, str], verbose: bool = False) -> None:
    """Every remote host must answer ``ssh HOST true`` within the start
    timeout, with the ssh command, port and key mpirun will use."""
    remote = hostlib.remote_hosts(hosts)
    if not remote:
        return
    timeout = start_timeout(args, dict(env))
    ssh = hostlib.ssh_base_command(hostlib.rsh_agent(env, split_mpi_args(args.mpi_args)),
                                   args.ssh_port, args.ssh_identity_file)
    if verbose:
        print("tfhvdrun: checking ssh to %s (%s, timeout %d s)" % (
            ", ".join(remote), " ".join(ssh), timeout), file=sys.stderr, flush=True)
    failed = hostlib.check_ssh(remote, ssh, timeout, env)
    if failed:
        detail = "\n".join("  %s: %s" % f for f in failed)
        raise LaunchError(
            "tfhvdrun: %d host%s not reachable over ssh within --start-timeout %d s:\n%s\n"
            "Check the host names, that sshd runs there, and that `%s HOST true` works "
            "without a password (-p/--ssh-port and -i/--ssh-identity-file set the port and key)."
            % (len(failed), " is" if len(failed) == 1 else "s are", timeout, detail,
               " ".join(ssh)), EXIT_UNREACHABLE)


def run_job(cmd: Sequence[str], env: Mapping[str, str],
            stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None,
            on_line: Optional[Callable[[Line], bool]] = None,
            tracker: Optional[FailureTracker] = None,
            timeout: Optional[float] = None, output_dir: Optional[str] = None) -> int:
    """Runs mpirun, copying its output line by line; returns its exit code.

    Lines are reassembled per rank (see :class:`~tfhvd.runner.output.Demux`)
    so ranks' output never interleaves mid-line.  ``on_line`` sees every line
    first and returns True to swallow it.  SIGINT and SIGTERM are passed on
    to mpirun, which ends the job.  After ``timeout`` seconds mpirun is
    terminated and the exit code is 124.  A job killed by signal N exits
    with 128 + N, as a shell reports it.  With ``output_dir`` each rank's
    lines also go to ``output_dir/rank.N/stdout`` and ``stderr`` (untagged).
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    tracker = tracker if tracker is not None else FailureTracker()
    # mpirun gets its own process group: a Ctrl-C reaches it once, through
    # the handler below, instead of twice (mpirun takes a second SIGINT as
    # "kill everything now, skip the clean-up").
    proc = subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=set_pdeathsig,
                            start_new_session=True)
    sink = LineSink(out, err, tracker, on_line, output_dir)

    def pump(pipe, name: str) -> None:
        demux = Demux(name)
        for raw in iter(pipe.readline, b""):
            sink.emit(demux.feed(raw.decode(errors="replace")), name)
        sink.emit(demux.flush(), name)
        pipe.close()

    readers = [threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True)]
    for t in readers:
        t.start()
    previous = {}
    interrupted: List[int] = []
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        def forward(signum, _frame):
            if proc.poll() is None:
                interrupted.append(signum)
                proc.send_signal(signum)
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, forward)
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    for t in readers:
        t.join(timeout=10)
    sink.close()
    code = proc.returncode
    if timed_out:
        err.write("tfhvdrun: the job ran longer than %g s and was stopped.\n" % timeout)
        code = 124
    elif interrupted and code != 0:
        # mpirun ends the ranks and exits 1: report it as the Gloo path and a
        # shell do, 128 + the signal (130 for Ctrl-C).
        code = 128 + interrupted[0]
        err.write("tfhvdrun: interrupted; every rank was stopped.\n")
    elif code < 0:
        code = 128 - code
    if code != 0:
        err.write(tracker.summary(code) + "\n")
    err.flush()
    return code


GLOO_INSTALL_HINT = (
    "Install Gloo, e.g. on Debian/Ubuntu: sudo apt-get install -y libgloo-dev, then rebuild "
    "tfhvd (`make setup` in the source tree does both).")


def library_backends(path: Optional[str] = None) -> Dict[str, bool]:
    """Which CPU backends the installed library links (``{"mpi": .., "gloo": ..}``),
    read from the names of the shared libraries it needs, without loading it
    (loading would import TensorFlow)."""
    if path is None:
        from tfhvd.common.library import library_path

        path = library_path()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return {"mpi": False, "gloo": False}
    return {"mpi": b"libmpi.so" in data, "gloo": b"libgloo.so" in data}


def choose_gloo(args: argparse.Namespace, env: Mapping[str, str],
                backends: Optional[Mapping[str, bool]] = None) -> bool:
    """Whether the job runs under Gloo: ``--gloo``/``--mpi`` decide; without
    either, MPI when mpirun is installed and the library has MPI (Horovod's
    default), else Gloo when the library has it.  Raises
    :class:`LaunchError` for a backend the library was built without."""
    b = library_backends() if backends is None else backends
    if args.use_gloo:
        if not b.get("gloo"):
            raise LaunchError("tfhvdrun --gloo: this tfhvd library was built without Gloo. "
                              + GLOO_INSTALL_HINT + " Or drop --gloo to run under mpirun.")
        return True
    if args.use_mpi:
        if not b.get("mpi"):
            raise LaunchError("tfhvdrun --mpi: this tfhvd library was built without MPI "
                              "(TFHVD_WITHOUT_MPI=1). " + MPI_INSTALL_HINT
                              + " Or run with --gloo.")
        return False
    have_mpirun = shutil.which("mpirun", path=hostlib.env_path(env)) is not None
    return bool(b.get("gloo")) and not (have_mpirun and b.get("mpi"))


def run_gloo(args: argparse.Namespace, env: Mapping[str, str], **job: Any) -> int:
    """Checks and runs a ``--gloo`` job (see :mod:`tfhvd.runner.gloo.job`);
    ``job`` goes to ``run_gloo_job`` (stdout, stderr, on_line, tracker,
    timeout)."""
    from tfhvd.runner.gloo.job import run_gloo_job

    for flag, value in (("--mpi-args", args.mpi_args), ("--binding-args", args.binding_args)):
        if value:
            raise UsageError("%s %r: a --gloo job runs without mpirun; drop %s or use --mpi"
                             % (flag, value, flag))
    iface = None
    if args.network_interface:
        iface = args.network_interface.split(",")[0]
        if "/" in iface:
            raise UsageError("--network-interface %s: under --gloo give an interface name "
                             "(e.g. eth0), not a subnet" % args.network_interface)
    hosts = resolve_hosts(args)
    check_program(args.command, env)
    check_hosts(args, hosts, env, verbose=args.verbose)
    extra = settings_env(args)
    if iface:
        extra.update({"TFHVD_SOCKET_IFNAME": iface, "NCCL_SOCKET_IFNAME": iface})
    if not any(env.get(p + "GLOO_TIMEOUT_SECONDS") for p in ("TFHVD_", "HOROVOD_")):
        # Ranks wait for each other at the rendezvous as long as for ssh.
        extra["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(start_timeout(args, dict(env)))
    ssh = hostlib.ssh_base_command(hostlib.rsh_agent(env, []), args.ssh_port,
                                   os.path.abspath(args.ssh_identity_file)
                                   if args.ssh_identity_file else None)
    return run_gloo_job(list(args.command), plan_slots(hosts, args.num_proc), env, extra, ssh,
                        iface=iface, output_dir=_output_dir(args), verbose=args.verbose, **job)


def job_env(env: Mapping[str, str], args: argparse.Namespace) -> Dict[str, str]:
    """mpirun's environment: the launcher's, with the flags' settings."""
    out = dict(env)
    out.update(settings_env(args))
    return out


def prepare(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """Parses, checks and builds: the mpirun command for ``argv``, or
    :class:`LaunchError`/:class:`UsageError`/:class:`HostError`."""
    args = parse_args(argv)
    hosts = resolve_hosts(args)
    mpirun = find_mpirun(env)
    check_program(args.command, env)
    check_hosts(args, hosts, env, verbose=args.verbose)
    return build_mpirun_command(args, env, mpirun=mpirun)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``tfhvdrun`` and ``python -m tfhvd.runner``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        args = parse_args(argv)
        for line in args.warnings:
            print(line, file=sys.stderr, flush=True)
        out, err = _streams(args)
        if args.check_build:
            from tfhvd.runner.check_build import check_build

            print(check_build(), flush=True)
            return 0
        if is_elastic(args):
            check_program(args.command, env)
            from tfhvd.runner.elastic.launch import run_elastic

            return run_elastic(args, env, stdout=out, stderr=err)
        if choose_gloo(args, env):
            return run_gloo(args, env, stdout=out, stderr=err)
        cmd = prepare(argv, env)
    except (UsageError, HostError) as e:
        msg = str(e)
        print(msg if msg.startswith("tfhvdrun") else "tfhvdrun: error: %s" % msg,
              file=sys.stderr)
        if isinstance(e, UsageError):
            print("Run `tfhvdrun --help` for the options.", file=sys.stderr)
        return EXIT_USAGE
    except LaunchError as e:
        print(str(e), file=sys.stderr)
        return e.code
    if args.verbose:
        print("tfhvdrun: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    return run_job(cmd, job_env(env, args), stdout=out, stderr=err,
                   output_dir=_output_dir(args))


def _output_dir(args: argparse.Namespace) -> Optional[str]:
    return os.path.abspath(args.output_filename) if args.output_filename else None


class TimestampedStream(io.TextIOBase):
    """A text stream that starts every line written to ``stream`` with the
    time (``time.asctime()``, then the rank's tag: Horovod's
    ``--prefix-output-with-timestamp`` form).  Writers hand it whole lines
    (:class:`~tfhvd.runner.output.LineSink` does); a line written in pieces
    is stamped once, at its first piece."""

    def __init__(self, stream: TextIO, clock: Callable[[], str] = time.asctime) -> None:
        super().__init__()
        self._stream = stream
        self._clock = clock
        self._at_start = True

    def write(self, text: str) -> int:
        pieces = []
        for part in text.splitlines(keepends=True):
            if self._at_start:
                pieces.append(self._clock())
            pieces.append(part)
            self._at_start = part.endswith("\n")
        self._stream.write("".join(pieces))
        return len(text)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._stream.flush()


def _streams(args: argparse.Namespace) -> Tuple[TextIO, TextIO]:
    """Where the job's output goes: the terminal, stamped with
    ``--prefix-output-with-timestamp``."""
    if args.prefix_output_with_timestamp:
        return TimestampedStream(sys.stdout), TimestampedStream(sys.stderr)
    return sys.stdout, sys.stderr
