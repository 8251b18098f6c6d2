"""What an elastic job on a cluster engine (Ray, Spark) shares with the others.

The engine starts the workers; tfhvd's elastic driver decides who they are.
:func:`member_env` is the environment of one member of a world (the elastic
worker's variables plus its Gloo launch variables), and :func:`run_driver`
runs the driver with its discovery thread to the end of the job.
"""

import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

from tfhvd.runner.common import Slot, WorkerError, worker_env
from tfhvd.common import elastic_worker as wk
from tfhvd.runner.elastic.driver import DISCOVER_HOSTS_FREQUENCY_S, ElasticDriver, World, \
    split_id
from tfhvd.runner.elastic.service import ElasticService
from tfhvd.common.secret import secret_env


def member_env(world: World, wid: str, service: ElasticService, addr: str,
               rendezvous_port: int, extra: Mapping[str, str], timeout_s: float,
               iface: Optional[str], world_env: Mapping[str, str]) -> Dict[str, str]:
    """The variables worker ``wid`` of ``world`` runs with: its rank and
    topology, the driver's and the rendezvous server's addresses, the job's
    secret (TFHVD_SECRET_KEY), ``extra`` (the user's), and ``world_env``
    (the world's Gloo scope)."""
    info = world.info[wid]
    slot = Slot(info["rank"], split_id(wid)[0], info["local_rank"], info["local_size"],
                info["cross_rank"], info["cross_size"])
    env = dict(extra)
    env.update(secret_env(service.secret))
    env.update({wk.ELASTIC_ENV: "1", wk.WORKER_ENV: wid,
                wk.DRIVER_ENV: "%s:%d" % (addr, service.port),
                wk.ROUND_ENV: str(world.round), "PYTHONUNBUFFERED": "1",
                "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(timeout_s))})
    env.update(world_env)
    return worker_env({}, slot, info["size"], addr, rendezvous_port, iface, env)


def discover_until_done(driver: ElasticDriver,
                        period: float = DISCOVER_HOSTS_FREQUENCY_S) -> None:
    """A discovery pass every ``period`` seconds until the job ends (sleeps between)."""
    while not driver.done:
        driver.poll_hosts()
        with driver.cond:
            if not driver.done:
                driver.cond.wait(period)


def run_driver(driver: ElasticDriver, discover_first: bool = False) -> Optional[str]:
    """Starts round 1, runs discovery beside the job, waits for its end.

    Returns None when the job succeeded, else the reason it failed.  With
    ``discover_first`` the discovery thread runs while round 1 waits for its
    slots (an engine whose workers register after the job starts)."""
    def discover() -> None:
        discover_until_done(driver)

    thread = threading.Thread(target=discover, daemon=True, name="tfhvd-engine-discovery")
    if discover_first:
        thread.start()
    try:
        driver.start()
        if not discover_first:
            thread.start()
        return driver.wait()
    except Exception as e:  # noqa: BLE001 - a job that could not start
        with driver.cond:
            driver._finish(str(e))
        return str(e)


def job_outcome(engine: str, error: Optional[str], errors: Mapping[str, Any],
                results: Mapping[str, Tuple[int, Any]]) -> List[Any]:
    """An engine's elastic job's return value: the finished workers' results in
    rank order, or a :class:`~tfhvd.runner.common.WorkerError` raised for
    ``error`` with the first failed worker's failure (``errors`` by worker, in
    the order the failures were recorded)."""

    if error:
        detail = ""
        if errors:
            wid = next(iter(errors))  # in the order they were recorded: the first
            detail = "; first failure, worker %s: %s" % (wid, errors[wid])
        raise WorkerError("tfhvd.%s elastic job failed: %s%s" % (engine, error, detail), -1)
    return [v for _, v in sorted(results.values(), key=lambda rv: rv[0])]


class WorldScopes:
    """Each world's Gloo rendezvous scope (``<prefix>-<round>``) on ``store``; the
    previous world's keys are dropped when a newer world first asks.  Call it as
    the driver's ``world_env``."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix, self.last_round = store, prefix, 0

    def __call__(self, world: World) -> Dict[str, str]:
        if world.round > self.last_round:
            if self.last_round:
                self.store.delete_scope("%s-%d" % (self.prefix, self.last_round))
            self.last_round = world.round
        return {"HOROVOD_GLOO_SCOPE": "%s-%d" % (self.prefix, world.round)}
