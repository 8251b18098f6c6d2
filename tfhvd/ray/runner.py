"""``RayExecutor``: a fixed-size tfhvd job on Ray actors.

How a job starts (:meth:`RayExecutor.start`):

1. a placement group reserves one bundle per worker (``num_workers``, packed)
   or one per host (``num_hosts`` x ``num_workers_per_host``, strictly
   spread); it must be ready within ``placement_group_timeout_s``;
2. one actor per worker starts in its bundle and reports its node;
3. ranks are given host by host (:func:`tfhvd.runner.engines.rank_order`),
   a rendezvous server starts on the driver (loopback when every worker is on
   the driver's node), and every actor receives its
   :class:`~tfhvd.runner.engines.Bootstrap`, so its ``hvd.init()`` forms the
   world over Gloo exactly as under ``tfhvdrun --gloo``.

Called from inside a placement group (a Ray task or actor of a Tune trial),
the executor places its workers in that group's bundles instead
(``use_current_placement_group``, Horovod's default), and leaves the group
to its owner at shutdown.

With ``min_workers`` (Horovod's elastic ``RayExecutor``) the executor runs
an elastic job instead: :meth:`run` is then
:meth:`tfhvd.ray.ElasticRayExecutor.run`, with the same settings.

How a call ends (:meth:`run`, :meth:`execute`): the results come back in rank
order.  The first rank that raises, or whose actor dies, ends the job: the
other actors are stopped (they would wait forever in a collective with the
lost rank) and a :class:`~tfhvd.runner.engines.WorkerError` names the rank
and carries its traceback.  The executor must then be started again.
"""

import os
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tfhvd.runner.engines import Bootstrap, WorkerError, call_as_rank, driver_endpoint, \
    engine_slots, rank_order, session_mode
from tfhvd.runner.gloo.rendezvous import RendezvousServer
from tfhvd.common.secret import secret_env
from tfhvd.ray.worker import BaseHorovodWorker

# After the first failure, how long other ranks' failures are awaited so that
# a dead actor is named rather than the peers that lost it.
_SETTLE_S = 2.0


@dataclass
class RaySettings:
    """What :meth:`RayExecutor.create_settings` returns."""

    timeout_s: float = 30.0
    ssh_identity_file: Optional[str] = None
    ssh_str: Optional[str] = None
    placement_group_timeout_s: float = 100.0
    nics: Optional[Sequence[str]] = None
    # Elastic mode (min_workers) with override_discovery=False: the hosts.
    discovery: Optional[Any] = None


def _deprecated(old: str, new: str) -> None:
    warnings.warn("RayExecutor: %s is deprecated (Horovod 0.22 deprecated it, 0.24 removed "
                  "it); use %s" % (old, new), DeprecationWarning, stacklevel=3)


class BaseWorker(BaseHorovodWorker):
    """The actor class of one rank (made a Ray actor in :func:`_actor_class`),
    with Horovod's worker interface; its rank and job come from
    :meth:`bootstrap`."""

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        super().__init__(world_rank, world_size)
        self.executable: Any = None
        self.rank: int = -1

    def node(self) -> Dict[str, Any]:
        return {"ip": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def bootstrap(self, boot: Bootstrap) -> None:
        self.rank = boot.slot.rank
        boot.apply(ray.util.get_node_ip_address())

    def start_executable(self, executable_cls: Optional[type] = None,
                         executable_args: Optional[Sequence] = None,
                         executable_kwargs: Optional[Dict] = None) -> None:
        if executable_cls is not None:
            self.executable = call_as_rank(self.rank, executable_cls, executable_args or (),
                                           executable_kwargs or {})

    def execute(self, func: Callable) -> Any:
        return call_as_rank(self.rank, func, (self.executable,))

    def run(self, fn: Callable, args: Sequence, kwargs: Dict) -> Any:
        return call_as_rank(self.rank, fn, args, kwargs)

    def env(self, key: str) -> Optional[str]:
        return os.environ.get(key)


def _worker_shape(cpus: float, gpus: float) -> Dict[str, float]:
    return {"CPU": cpus, "GPU": gpus} if gpus else {"CPU": cpus}


def _room(bundles: Sequence[Dict[str, float]], cpus: float, gpus: float) -> int:
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs the bundles hold."""
    needs = [(k, need) for k, need in (("CPU", cpus), ("GPU", gpus)) if need]
    if not needs:
        return sys.maxsize  # a worker that needs nothing fits anywhere
    return sum(min(int(b.get(k, 0) // need) for k, need in needs) for b in bundles)


def _actor_class(cpus: float, gpus: float, pg, bundle: int):
    return ray.remote(BaseWorker).options(
        num_cpus=cpus, num_gpus=gpus, max_restarts=0,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=bundle))


def wait_refs(refs: Sequence["ray.ObjectRef"], on_failure: Callable[[], None],
              what: str = "rank") -> List[Any]:
    """The values of ``refs`` (one per rank, in rank order).  The first
    failure calls ``on_failure`` (which stops the rest) and raises a
    :class:`WorkerError` for the likeliest cause: a dead worker before the
    ranks that lost their peer, then the lowest rank."""
    index = {r: i for i, r in enumerate(refs)}
    results: Dict[int, Any] = {}
    errors: Dict[int, BaseException] = {}
    pending = list(refs)
    settle_until: Optional[float] = None
    while pending:
        timeout = None if settle_until is None else max(0.0, settle_until - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
        for ref in done:
            try:
                results[index[ref]] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - sorted out below
                errors[index[ref]] = e
                if settle_until is None:
                    settle_until = time.monotonic() + _SETTLE_S
        if errors and (not pending or time.monotonic() >= settle_until):
            break
    if not errors:
        return [results[i] for i in range(len(refs))]
    on_failure()
    died = {i: e for i, e in errors.items() if isinstance(e, ray.exceptions.RayActorError)}
    rank = min(died) if died else min(errors)
    raise _as_worker_error(rank, errors[rank], what)


def _as_worker_error(rank: int, e: BaseException, what: str) -> WorkerError:
    cause = getattr(e, "cause", None)
    if isinstance(e, WorkerError):
        cause = e
    if isinstance(cause, WorkerError):
        err = WorkerError("tfhvd.ray: %s" % cause.args[0], cause.rank, cause.worker_traceback)
    elif isinstance(e, ray.exceptions.RayActorError):
        err = WorkerError("tfhvd.ray: the worker of %s %d died (its actor was lost: %s); "
                          "every worker of the job was stopped"
                          % (what, rank, str(e).splitlines()[0] if str(e) else type(e).__name__),
                          rank)
    else:
        err = WorkerError("tfhvd.ray: %s %d failed: %s" % (what, rank, e), rank, str(e))
    err.__cause__ = e
    return err


class RayExecutor:
    """A tfhvd job of ``num_workers`` Ray actors (Horovod's ``RayExecutor``).

    Args:
      settings: from :meth:`create_settings`.
      num_workers: number of ranks, packed onto as few nodes as fit; or
      num_hosts / num_workers_per_host: that many ranks on each of that many
        distinct nodes.
      cpus_per_worker / use_gpu / gpus_per_worker: each actor's resources.
      use_current_placement_group: called inside a placement group, put the
        workers in its bundles (one per worker, or per host with num_hosts).
      min_workers / max_workers / reset_limit / cooldown_range /
        elastic_timeout / override_discovery: an elastic job (Horovod's
        elastic ``RayExecutor``), run by :class:`ElasticRayExecutor`;
        ``override_discovery=False`` takes the hosts from
        ``settings.discovery``.
      num_slots / cpus_per_slot / gpus_per_slot: Horovod's deprecated names
        of num_workers_per_host / cpus_per_worker / gpus_per_worker.
    """

    @staticmethod
    def create_settings(timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: float = 100,
                        nics: Optional[Sequence[str]] = None) -> RaySettings:
        """Settings of an executor: ``timeout_s`` bounds the workers' start and
        the ranks' rendezvous; ``placement_group_timeout_s`` how long the
        cluster may take to grant the resources.  The ssh options are
        accepted for Horovod's signature and unused: Ray starts the workers."""
        return RaySettings(float(timeout_s), ssh_identity_file, ssh_str,
                           float(placement_group_timeout_s), nics)

    def __init__(self, settings: RaySettings, num_workers: Optional[int] = None,
                 num_hosts: Optional[int] = None, num_workers_per_host: int = 1,
                 cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: Optional[float] = None,
                 use_current_placement_group: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 reset_limit: Optional[int] = None,
                 cooldown_range: Optional[Tuple[float, float]] = None,
                 elastic_timeout: float = 600, override_discovery: bool = True,
                 num_slots: Optional[int] = None, cpus_per_slot: Optional[float] = None,
                 gpus_per_slot: Optional[float] = None) -> None:
        if num_slots is not None:
            _deprecated("num_slots", "num_workers_per_host (with num_hosts) or num_workers")
            num_workers_per_host = num_slots
        if cpus_per_slot is not None:
            _deprecated("cpus_per_slot", "cpus_per_worker")
            cpus_per_worker = cpus_per_slot
        if gpus_per_slot is not None:
            _deprecated("gpus_per_slot", "gpus_per_worker")
            gpus_per_worker = gpus_per_slot
        self.settings = settings
        self.workers: List[Any] = []
        self._pg = None
        self._own_pg = True
        self._server: Optional[RendezvousServer] = None
        self._elastic = None
        if min_workers is not None or max_workers is not None:
            self._elastic = _elastic_executor(
                settings, num_workers, num_hosts, min_workers, max_workers, reset_limit,
                cooldown_range, elastic_timeout, override_discovery, use_gpu,
                cpus_per_worker, gpus_per_worker)
            return
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("RayExecutor needs exactly one of num_workers (got %r) and "
                             "num_hosts (got %r)" % (num_workers, num_hosts))
        if num_workers is not None and num_workers < 1:
            raise ValueError("num_workers must be at least 1, got %d" % num_workers)
        if num_hosts is not None and (num_hosts < 1 or num_workers_per_host < 1):
            raise ValueError("num_hosts (%d) and num_workers_per_host (%d) must be at least 1"
                             % (num_hosts, num_workers_per_host))
        if gpus_per_worker and not use_gpu:
            raise ValueError("gpus_per_worker=%r needs use_gpu=True" % gpus_per_worker)
        self.use_current_placement_group = use_current_placement_group
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers if num_workers is not None else \
            num_hosts * num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0

    # ---- start ----------------------------------------------------------
    def _placement(self):
        """The caller's placement group (not ours to remove) or a new one."""
        current = (ray.util.get_current_placement_group()
                   if self.use_current_placement_group else None)
        if current is not None:
            room = _room(current.bundle_specs, self.cpus_per_worker, self.gpus_per_worker)
            if room < self.num_workers:
                raise ValueError(
                    "RayExecutor.start: the current placement group's bundles %s hold %d "
                    "workers of %s, but num_workers is %d; pass "
                    "use_current_placement_group=False for a group of the executor's own"
                    % (current.bundle_specs, room, _worker_shape(
                        self.cpus_per_worker, self.gpus_per_worker), self.num_workers))
            self._own_pg = False
            return current
        self._own_pg = True
        one = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            one["GPU"] = self.gpus_per_worker
        if self.num_hosts is not None:
            per_host = {k: v * self.num_workers_per_host for k, v in one.items()}
            return placement_group([per_host] * self.num_hosts, strategy="STRICT_SPREAD")
        return placement_group([one] * self.num_workers, strategy="PACK")

    def start(self, executable_cls: Optional[type] = None,
              executable_args: Optional[Sequence] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Starts the actors and bootstraps tfhvd on them (``hvd.init()`` in a
        function run later forms the world).  ``executable_cls(*args,
        **kwargs)`` is then built on every worker, for :meth:`execute`."""
        session_mode({str(k): str(v) for k, v in (extra_env_vars or {}).items()},
                     "RayExecutor.start(extra_env_vars=...)")
        if self._elastic is not None:
            if executable_cls is not None:
                raise ValueError("RayExecutor.start: executable_cls is not available in "
                                 "elastic mode (min_workers given): workers come and go")
            self._elastic.env_vars.update({str(k): str(v)
                                           for k, v in (extra_env_vars or {}).items()})
            self._elastic.start()
            return
        if self.workers:
            raise RuntimeError("RayExecutor.start: the executor is already started; "
                               "call shutdown() first")
        if not ray.is_initialized():
            ray.init()
        self._pg = self._placement()
        ready, _ = ray.wait([self._pg.ready()], timeout=self.settings.placement_group_timeout_s)
        if not ready:
            need = self._pg.bundle_specs
            self.shutdown()
            raise TimeoutError(
                "RayExecutor.start: the cluster did not grant %d bundles of %s within "
                "placement_group_timeout_s=%g (available now: %s)"
                % (len(need), need[0], self.settings.placement_group_timeout_s,
                   ray.available_resources()))
        try:
            self._start_actors(executable_cls, executable_args or (),
                               executable_kwargs or {}, extra_env_vars or {})
        except BaseException:
            self.shutdown()
            raise

    def _start_actors(self, cls, args, kwargs, extra_env: Dict[str, str]) -> None:
        actors = []
        for i in range(self.num_workers):
            # In the caller's group (a Tune trial's, say) a worker takes any bundle
            # with room, as Horovod's do; in ours, its own (or its host's) bundle.
            bundle = -1 if not self._own_pg else \
                i // self.num_workers_per_host if self.num_hosts is not None else i
            actors.append(_actor_class(self.cpus_per_worker, self.gpus_per_worker,
                                       self._pg, bundle).remote())
        self.workers = actors
        what = "starting the workers" if self._own_pg else (
            "starting the workers in the current placement group (bundles %s; what else "
            "runs in them may hold their resources)" % (self._pg.bundle_specs,))
        nodes = self._get([a.node.remote() for a in actors], self.settings.timeout_s, what)
        order = rank_order([n["ip"] for n in nodes])
        self.workers = [actors[i] for i in order]
        hosts = [nodes[i]["ip"] for i in order]
        bind, addr = driver_endpoint(ray.util.get_node_ip_address(), hosts)
        self._server = RendezvousServer(bind)
        port = self._server.start()
        scope = "ray-" + uuid.uuid4().hex[:12]
        env = {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(max(self.settings.timeout_s, 1)))}
        env.update({str(k): str(v) for k, v in extra_env.items()})
        env.update(secret_env(self._server.secret))  # over Ray's channel, never argv
        slots = engine_slots(hosts)
        self._get([w.bootstrap.remote(Bootstrap(s, len(slots), addr, port, scope, env))
                   for w, s in zip(self.workers, slots)], self.settings.timeout_s,
                  "bootstrapping the workers")
        wait_refs([w.start_executable.remote(cls, args, kwargs) for w in self.workers],
                  self.shutdown)

    def _get(self, refs: List, timeout: float, what: str) -> List[Any]:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            raise TimeoutError("RayExecutor: %s took longer than timeout_s=%g (%d of %d "
                               "workers answered)" % (what, timeout, len(ready), len(refs)))
        return wait_refs(refs, self.shutdown, "worker")

    # ---- calls ------------------------------------------------------------
    def _check_started(self, what: str) -> None:
        if self._elastic is not None:
            raise RuntimeError("RayExecutor.%s is not available in elastic mode (min_workers "
                               "given): use run(fn), which runs an elastic job" % what)
        if not self.workers:
            raise RuntimeError("RayExecutor.%s: the executor is not started (call start(); "
                               "after a rank failed, start() again)" % what)

    def run_remote(self, fn: Callable, args: Optional[Sequence] = None,
                   kwargs: Optional[Dict] = None) -> List["ray.ObjectRef"]:
        """``fn(*args, **kwargs)`` on every rank; the object refs, in rank order."""
        self._check_started("run_remote")
        return [w.run.remote(fn, list(args or ()), dict(kwargs or {})) for w in self.workers]

    def run(self, fn: Callable, args: Optional[Sequence] = None,
            kwargs: Optional[Dict] = None, callbacks: Optional[List[Callable]] = None
            ) -> List[Any]:
        """``fn(*args, **kwargs)`` on every rank; its results in rank order.
        A rank that raises or dies ends the job (:class:`WorkerError`).  In
        elastic mode, :meth:`ElasticRayExecutor.run`."""
        if self._elastic is not None:
            return self._elastic.run(fn, callbacks=callbacks, args=args, kwargs=kwargs)
        results = wait_refs(self.run_remote(fn, args, kwargs), self.shutdown)
        for cb in callbacks or ():
            cb(results)
        return results

    def execute(self, fn: Callable, callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """``fn(executable)`` on every rank (the object ``start`` built); results
        in rank order."""
        self._check_started("execute")
        results = wait_refs([w.execute.remote(fn) for w in self.workers], self.shutdown)
        for cb in callbacks or ():
            cb(results)
        return results

    def execute_single(self, fn: Callable) -> Any:
        """``fn(executable)`` on rank 0 only (it must not need the other ranks)."""
        self._check_started("execute_single")
        return wait_refs([self.workers[0].execute.remote(fn)], self.shutdown)[0]

    # ---- end --------------------------------------------------------------
    def _stop_workers(self) -> None:
        for w in self.workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.workers = []

    def shutdown(self) -> None:
        """Stops every actor, frees the placement group and the rendezvous
        server.  The executor can be started again."""
        self._stop_workers()
        if self._pg is not None and self._own_pg:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - the cluster may be gone
                pass
            self._pg = None
        if self._server is not None:
            self._server.stop()
            self._server = None


def _elastic_executor(settings: RaySettings, num_workers: Optional[int],
                      num_hosts: Optional[int], min_workers: Optional[int],
                      max_workers: Optional[int], reset_limit: Optional[int],
                      cooldown_range: Optional[Tuple[float, float]], elastic_timeout: float,
                      override_discovery: bool, use_gpu: bool, cpus_per_worker: float,
                      gpus_per_worker: Optional[float]):
    """The :class:`ElasticRayExecutor` behind an elastic ``RayExecutor``."""
    from tfhvd.ray.elastic import ElasticRayExecutor

    if min_workers is None or min_workers < 1:
        raise ValueError("RayExecutor: an elastic job (max_workers=%r) needs a positive "
                         "min_workers, got %r" % (max_workers, min_workers))
    if num_workers is not None or num_hosts is not None:
        both = "num_workers" if num_workers is not None else "num_hosts"
        raise ValueError("Both `min_workers` and `%s` provided. RayExecutor: min_workers=%d "
                         "(elastic) excludes num_workers=%r and num_hosts=%r (fixed size); "
                         "give one or the other" % (both, min_workers, num_workers, num_hosts))
    if max_workers is not None and max_workers < min_workers:
        raise ValueError("RayExecutor: max_workers=%d is below min_workers=%d"
                         % (max_workers, min_workers))
    es = ElasticRayExecutor.create_settings(
        min_np=min_workers, max_np=max_workers, reset_limit=reset_limit,
        elastic_timeout=elastic_timeout, timeout_s=settings.timeout_s, nics=settings.nics,
        cooldown_range=cooldown_range)
    es.discovery = settings.discovery
    return ElasticRayExecutor(es, use_gpu=use_gpu, cpus_per_slot=cpus_per_worker,
                              gpus_per_slot=gpus_per_worker,
                              override_discovery=override_discovery)
