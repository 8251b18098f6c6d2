"""``ElasticRayExecutor``: an elastic tfhvd job on Ray actors.

The job is tfhvd's own elastic driver (:mod:`tfhvd.runner.elastic.driver`,
the one ``tfhvdrun --host-discovery-script`` runs) with Ray in place of
processes and a discovery script:

* hosts are the cluster's alive nodes, each with ``CPU / cpus_per_slot``
  slots (GPUs too with ``use_gpu``), read from ``ray.nodes()`` every second
  (:class:`RayHostDiscovery`); with ``override_discovery=False`` they come
  from ``settings.discovery`` instead (a subclass of it, say, that holds
  some nodes back);
* a worker is an actor started on its host's node (node affinity); it sets
  the elastic worker's variables (driver address, worker id, token, world
  topology, Gloo scope) in its environment and runs the function, whose
  ``hvd.elastic.run`` talks to the driver as under tfhvdrun;
* an actor that dies (or whose function raises) is a failed worker: its node
  is blacklisted for a short cooldown (1-4 s; it comes back, as a node with
  room does), the survivors reset and the driver fills the world again.

:meth:`ElasticRayExecutor.run` returns the results of the workers that
finished, in the rank order of the last world.
"""

import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tfhvd.runner.elastic.discovery import HostDiscovery, HostManager
from tfhvd.runner.elastic.driver import ElasticDriver, World, split_id
from tfhvd.runner.elastic.engine import WorldScopes, job_outcome, member_env, run_driver
from tfhvd.runner.elastic.service import ElasticService
from tfhvd.runner.engines import LOOPBACK, WorkerError, become_rank, call_as_rank, \
    driver_endpoint, session_mode
from tfhvd.runner.gloo.rendezvous import RendezvousServer

COOLDOWN_S = (1, 4)


@dataclass
class ElasticRaySettings:
    """What :meth:`ElasticRayExecutor.create_settings` returns."""

    min_np: int = 1
    max_np: Optional[int] = None
    reset_limit: Optional[int] = None
    elastic_timeout: float = 600.0
    timeout_s: float = 30.0
    nics: Optional[Sequence[str]] = None
    cooldown_range: Optional[Tuple[float, float]] = None
    verbose: int = 1
    # Used with ElasticRayExecutor(override_discovery=False).
    discovery: Optional[HostDiscovery] = None


def node_alive(node: Dict[str, Any]) -> bool:
    """Whether a ``ray.nodes()`` record is of a live node.  Ray's records carry
    ``Alive`` (and, in recent releases, ``alive`` too); Horovod reads
    ``alive``, and so do the records its tests mock: either is accepted."""
    for key in ("Alive", "alive"):
        if key in node:
            return bool(node[key])
    return str(node.get("State", node.get("state", ""))).upper() == "ALIVE"


class RayHostDiscovery(HostDiscovery):
    """The cluster's alive nodes (by address) and how many slots each has:
    ``CPU // cpus_per_slot``, and with ``use_gpu`` at most ``GPU //
    gpus_per_slot`` (Horovod's signature; ``cpus_per_worker`` and
    ``gpus_per_worker`` are its newer names)."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: float = 1, cpus_per_worker: Optional[float] = None,
                 gpus_per_worker: Optional[float] = None) -> None:
        self.use_gpu = bool(use_gpu)
        self.cpus_per_slot = cpus_per_worker if cpus_per_worker is not None else cpus_per_slot
        gpus = gpus_per_worker if gpus_per_worker is not None else gpus_per_slot
        self.gpus_per_slot = (gpus or 1) if self.use_gpu else 0

    def find_available_hosts_and_slots(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for node in ray.nodes():
            if not node_alive(node):
                continue
            res = node.get("Resources", {})
            slots = int(res.get("CPU", 0) // self.cpus_per_slot) if self.cpus_per_slot else 0
            if self.gpus_per_slot:
                slots = min(slots, int(res.get("GPU", 0) // self.gpus_per_slot))
            if slots > 0:
                out[node["NodeManagerAddress"]] = out.get(node["NodeManagerAddress"], 0) + slots
        return out


class ElasticWorker:
    """The actor of one elastic worker (made a Ray actor at spawn)."""

    def run(self, env: Dict[str, str], fn: Callable, args: Sequence, kwargs: Dict
            ) -> Tuple[str, int, Any]:
        become_rank(env)
        try:
            value = call_as_rank(int(env["HOROVOD_RANK"]), fn, args, kwargs)
        except WorkerError as e:
            if isinstance(e.__cause__, SystemExit) and not e.__cause__.code:
                return "left", -1, None  # not part of the next world
            raise
        return "done", int(os.environ.get("HOROVOD_RANK", "-1")), value


class ElasticRayExecutor:
    """An elastic job on Ray (Horovod's ``ElasticRayExecutor``).

    Args:
      settings: from :meth:`create_settings`.
      use_gpu / cpus_per_slot / gpus_per_slot: each worker's resources (a
        node offers as many slots as it has room for).
      env_vars: variables every worker gets.
      override_discovery: True (default): the hosts are the cluster's nodes
        (:class:`RayHostDiscovery`); False: ``settings.discovery``, which
        must then be set (any object with ``find_available_hosts_and_slots()``
        returning ``{host address: slots}``).
    """

    @staticmethod
    def create_settings(min_np: int = 1, max_np: Optional[int] = None,
                        reset_limit: Optional[int] = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[Sequence[str]] = None,
                        min_num_proc: Optional[int] = None,
                        max_num_proc: Optional[int] = None,
                        cooldown_range: Optional[Tuple[float, float]] = None,
                        verbose: int = 1) -> ElasticRaySettings:
        """``min_np``/``max_np`` (or Horovod's ``min_num_proc``/``max_num_proc``)
        bound the world; ``elastic_timeout`` how long a world may wait for its
        minimum; ``timeout_s`` the rendezvous of each world;
        ``cooldown_range`` (seconds, min and max) how long a failed worker's
        host is left out (default 1 to 4 s).  ``verbose`` is accepted for
        Horovod's signature."""
        if cooldown_range is not None:
            lo, hi = (float(v) for v in cooldown_range)
            if not 0 <= lo <= hi:
                raise ValueError("ElasticRayExecutor: cooldown_range must be (min, max) "
                                 "seconds with 0 <= min <= max, got %r" % (cooldown_range,))
            cooldown_range = (lo, hi)
        return ElasticRaySettings(int(min_num_proc or min_np),
                                  max_num_proc if max_num_proc is not None else max_np,
                                  reset_limit, float(elastic_timeout), float(timeout_s), nics,
                                  cooldown_range, int(verbose))

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = None,
                 env_vars: Optional[Dict[str, str]] = None,
                 override_discovery: bool = True,
                 min_workers: Optional[int] = None, max_workers: Optional[int] = None,
                 cpus_per_worker: Optional[float] = None,
                 gpus_per_worker: Optional[float] = None) -> None:
        self.settings = settings
        if min_workers is not None:
            settings.min_np = int(min_workers)
        if max_workers is not None:
            settings.max_np = int(max_workers)
        if cpus_per_worker is not None:
            cpus_per_slot = cpus_per_worker
        if gpus_per_worker is not None:
            gpus_per_slot = gpus_per_worker
        self.use_gpu = bool(use_gpu)
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.override_discovery = bool(override_discovery)
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        session_mode(self.env_vars, "ElasticRayExecutor(env_vars=...)")
        self._started = False

    def discovery(self) -> HostDiscovery:
        """Where the job's hosts come from (see ``override_discovery``)."""
        if self.override_discovery:
            return RayHostDiscovery(self.use_gpu, self.cpus_per_slot, self.gpus_per_slot)
        found = getattr(self.settings, "discovery", None)
        if found is None or not callable(getattr(found, "find_available_hosts_and_slots", None)):
            raise ValueError("ElasticRayExecutor(override_discovery=False) needs "
                             "settings.discovery, an object with "
                             "find_available_hosts_and_slots(); got %r" % (found,))
        return found

    def start(self) -> None:
        """Checks that Ray is up (``ray.init()`` if not); workers start in :meth:`run`."""
        self.discovery()
        if not ray.is_initialized():
            ray.init()
        self._started = True

    def run(self, worker_fn: Callable, callbacks: Optional[List[Callable]] = None,
            args: Optional[Sequence] = None, kwargs: Optional[Dict] = None) -> List[Any]:
        """Runs ``worker_fn`` (which uses ``hvd.elastic.run``) as an elastic job
        until it ends; the finished workers' results in rank order.  The
        positional order is Horovod's (``run(worker_fn, callbacks)``);
        ``args``/``kwargs`` are tfhvd's, for ``worker_fn(*args, **kwargs)``.  Raises
        :class:`WorkerError` when the job fails (reset limit, no slots within
        ``elastic_timeout``, every worker failed)."""
        if not self._started:
            raise RuntimeError("ElasticRayExecutor.run: call start() first")
        job = _ElasticRayJob(self, worker_fn, list(args or ()), dict(kwargs or {}))
        results = job.run()
        for cb in callbacks or ():
            cb(results)
        return results


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


class _ElasticRayJob:
    def __init__(self, ex: ElasticRayExecutor, fn: Callable, args: List, kwargs: Dict) -> None:
        self.ex, self.fn, self.args, self.kwargs = ex, fn, args, kwargs
        s = ex.settings
        self.hosts = HostManager(ex.discovery(), s.cooldown_range or COOLDOWN_S)
        first = self.hosts.discovery.find_available_hosts_and_slots()
        here = ray.util.get_node_ip_address()
        bind, self.addr = driver_endpoint(here, list(first))
        avail = sum(first.values())
        np_ = max(s.min_np, min(avail, s.max_np or avail))
        self.lock = threading.Lock()
        self.actors: Dict[str, Any] = {}
        self.results: Dict[str, Tuple[int, Any]] = {}
        self.errors: Dict[str, BaseException] = {}
        self.finished: List[Any] = []
        self.rendezvous = RendezvousServer(bind)
        self.rendezvous_port = self.rendezvous.start()
        self.world_scopes = WorldScopes(self.rendezvous.store, "ray-elastic")
        self.driver = ElasticDriver(self.hosts, np=np_, min_np=s.min_np, max_np=s.max_np,
                                    spawn=self._spawn, terminate=self._terminate,
                                    timeout=s.elastic_timeout, reset_limit=s.reset_limit,
                                    world_env=self.world_scopes)
        self.service = ElasticService(self.driver, bind, secret=self.rendezvous.secret)

    def _env(self, wid: str, world: World) -> Dict[str, str]:
        iface = "lo" if self.addr == LOOPBACK else (self.ex.settings.nics or [None])[0]
        return member_env(world, wid, self.service, self.addr, self.rendezvous_port,
                          self.ex.env_vars, self.ex.settings.timeout_s, iface,
                          self.world_scopes(world))

    def _node_id(self, host: str) -> Optional[str]:
        for node in ray.nodes():
            if node_alive(node) and node.get("NodeManagerAddress") == host:
                return node.get("NodeID")
        return None

    def _spawn(self, wid: str, world: World) -> None:
        env = self._env(wid, world)
        host = split_id(wid)[0]
        opts: Dict[str, Any] = {"num_cpus": self.ex.cpus_per_slot,
                                "num_gpus": self.ex.gpus_per_slot, "max_restarts": 0}
        node = self._node_id(host)
        if node is not None:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        actor = ray.remote(ElasticWorker).options(**opts).remote()
        with self.lock:
            self.actors[wid] = actor
        ref = actor.run.remote(env, self.fn, self.args, self.kwargs)
        threading.Thread(target=self._watch, args=(wid, actor, ref), daemon=True).start()

    def _watch(self, wid: str, actor: Any, ref: Any) -> None:
        code = 0
        try:
            status, rank, value = ray.get(ref)
            if status == "done":
                with self.lock:
                    self.results[wid] = (rank, value)
        except Exception as e:  # noqa: BLE001 - a failed worker, as its exit code
            code = 1
            with self.lock:
                self.errors[wid] = e
        with self.lock:
            if self.actors.get(wid) is actor:
                del self.actors[wid]
        if code:
            _kill(actor)
        else:
            # A finished worker's process stays until the job ends: peers
            # still shutting down their world must not see it vanish.
            with self.lock:
                self.finished.append(actor)
        self.driver.worker_exited(wid, code)

    def _terminate(self, wid: str) -> None:
        with self.lock:
            actor = self.actors.get(wid)
        if actor is not None:
            _kill(actor)

    def run(self) -> List[Any]:
        try:
            error = run_driver(self.driver)
        finally:
            with self.lock:
                wids = list(self.actors)
            for wid in wids:
                self._terminate(wid)
            with self.lock:
                finished, self.finished = self.finished, []
            for actor in finished:
                _kill(actor)
            self.service.stop()
            self.rendezvous.stop()
        with self.lock:
            return job_outcome("ray", error, dict(self.errors), dict(self.results))
