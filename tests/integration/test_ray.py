"""tfhvd.ray on a real local Ray cluster (ray.init(num_cpus=4), started here)."""

import os
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import ray

import engine_jobs as jobs
from tfhvd.ray import ElasticRayExecutor, RayExecutor, WorkerError

jobs.by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 1024 * 1024,
             log_to_driver=False)
    # This cluster's processes (raylet, GCS, workers) name its GCS address.
    gcs = ray.get_runtime_context().gcs_address
    procs = jobs.pids_matching(gcs)
    assert procs, "no process of the Ray cluster at %s found" % gcs
    yield
    ray.shutdown()
    assert jobs.wait_gone(procs) == [], "Ray's processes outlived ray.shutdown()"
    assert jobs.wait_gone(jobs.pids_matching(gcs)) == [], "Ray's workers outlived it"


def _executor(**kw) -> RayExecutor:
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2, **kw)
    ex.start()
    return ex


def _actor_pids(ex: RayExecutor):
    return [p["pid"] for p in ray.get([w.node.remote() for w in ex.workers])]


def test_collectives_run_execute_and_shutdown():
    class Counter:
        def __init__(self, start):
            self.value = start

    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    ex.start(executable_cls=Counter, executable_args=[5],
             extra_env_vars={"TFHVD_TEST_ENGINE_VAR": "from-driver"})
    try:
        pids = _actor_pids(ex)
        jobs.check_collectives(ex.run(jobs.collectives, args=["ray"]), "ray")
        refs = ex.run_remote(jobs.collectives, kwargs={"tag": "remote"})
        jobs.check_collectives(ray.get(refs), "remote")
        assert ex.execute(lambda c: c.value + 1) == [6, 6]
        assert ex.execute_single(lambda c: c.value * 2) == 10
        envs = ex.run(lambda: (os.environ["HOROVOD_RANK"], os.environ["TFHVD_TEST_ENGINE_VAR"],
                               os.environ["HOROVOD_CONTROLLER"]))
        assert envs == [("0", "from-driver", "gloo"), ("1", "from-driver", "gloo")]
        # Horovod's worker interface (BaseHorovodWorker) on the executor's actors.
        w = ex.workers[1]
        assert ray.get(w.env_vars.remote())["HOROVOD_RANK"] == "1"
        ray.get(w.update_env_vars.remote({"TFHVD_TEST_UPDATED": 7}))
        assert ex.run(lambda: os.environ.get("TFHVD_TEST_UPDATED")) == [None, "7"]
        assert ray.get(w.get_gpu_ids.remote()) == []
        assert ray.get(w.hostname.remote()) == __import__("socket").gethostname()
    finally:
        ex.shutdown()
    assert jobs.wait_gone(pids) == [], "actors outlived shutdown()"
    with pytest.raises(RuntimeError, match="not started"):
        ex.run(jobs.collectives, args=["x"])


def test_base_horovod_worker_subclassed_as_a_users_actor():
    """Horovod's public BaseHorovodWorker: a user's subclass, made an actor."""
    from tfhvd.ray import BaseHorovodWorker

    class Greeter:
        def __init__(self, greeting, name="x"):
            self.text = "%s %s" % (greeting, name)

    class MyWorker(BaseHorovodWorker):
        def rank_and_size(self):
            return os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"]

    actor = ray.remote(MyWorker).options(num_cpus=1).remote(world_rank=1, world_size=3)
    try:
        assert ray.get(actor.rank_and_size.remote()) == ("1", "3")
        ray.get(actor.start_executable.remote(Greeter, ["hello"], {"name": "ray"}))
        assert ray.get(actor.execute.remote(lambda g: g.text)) == "hello ray"
        ray.get(actor.set_queue.remote(None))
        assert ray.get(actor.env_vars.remote())["HOROVOD_HOSTNAME"]
    finally:
        ray.kill(actor)


def test_bad_arguments():
    s = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="exactly one of num_workers"):
        RayExecutor(s)
    with pytest.raises(ValueError, match="num_workers must be at least 1"):
        RayExecutor(s, num_workers=0)
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3), num_workers=9)
    with pytest.raises(TimeoutError, match="did not grant 9 bundles"):
        ex.start()
    bad = {"TFHVD_ENGINE_SESSION": "shared"}
    with pytest.raises(ValueError, match=r"extra_env_vars.*TFHVD_ENGINE_SESSION='shared'"):
        RayExecutor(s, num_workers=2).start(extra_env_vars=bad)
    with pytest.raises(ValueError, match=r"env_vars.*TFHVD_ENGINE_SESSION='shared'"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), env_vars=bad)


def test_horovod_names_and_elastic_mode_arguments():
    s = RayExecutor.create_settings(timeout_s=60)
    with pytest.raises(ValueError, match="excludes num_workers=2") as e:
        RayExecutor(s, num_workers=2, min_workers=1)
    assert str(e.value).startswith("Both `min_workers` and `num_workers` provided.")
    with pytest.raises(ValueError, match="needs a positive min_workers"):
        RayExecutor(s, max_workers=2)
    elastic = RayExecutor(s, min_workers=1, max_workers=2)
    with pytest.raises(RuntimeError, match="not available in elastic mode"):
        elastic.run_remote(jobs.collectives, args=["x"])
    with pytest.raises(ValueError, match="executable_cls is not available"):
        elastic.start(executable_cls=dict)
    # Horovod's deprecated names still place the workers: one host, two slots.
    with pytest.warns(DeprecationWarning, match="num_slots"), \
            pytest.warns(DeprecationWarning, match="cpus_per_slot"):
        ex = RayExecutor(s, num_hosts=1, num_slots=2, cpus_per_slot=1)
    assert (ex.num_workers, ex.cpus_per_worker) == (2, 1)
    ex.start()
    try:
        assert ex.run(lambda: os.environ["HOROVOD_SIZE"]) == ["2", "2"]
    finally:
        ex.shutdown()


def test_executor_inside_a_placement_group_uses_its_bundles():
    from ray.util.placement_group import placement_group, placement_group_table, \
        remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # One bundle for both workers: they take any bundle with room, as Horovod's do.
    pg = placement_group([{"CPU": 2}])
    ray.get(pg.ready(), timeout=60)

    @ray.remote(num_cpus=0)
    def trial():
        inner = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
        inner.start()
        try:
            ranks = inner.run(lambda: os.environ["HOROVOD_RANK"])
            same = inner._pg.id == ray.util.get_current_placement_group().id
        finally:
            inner.shutdown()
        too_big = RayExecutor(RayExecutor.create_settings(), num_workers=3)
        try:
            too_big.start()
            error = ""
        except ValueError as e:
            error = str(e)
        return ranks, same, error

    try:
        groups = len(placement_group_table())
        ranks, same, error = ray.get(trial.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_capture_child_tasks=True)).remote(), timeout=120)
        assert ranks == ["0", "1"] and same
        assert "hold 2 workers of {'CPU': 1}" in error and "num_workers is 3" in error, error
        assert len(placement_group_table()) == groups, "the executor made a group of its own"
        assert placement_group_table(pg)["state"] == "CREATED", "the caller's group was removed"
    finally:
        remove_placement_group(pg)


def test_elastic_mode_with_the_users_discovery():
    """Horovod's elastic RayExecutor (min_workers) with override_discovery=False:
    the hosts come from settings.discovery, here one slot of the two Ray has."""
    from tfhvd.ray import RayHostDiscovery

    class OneSlot(RayHostDiscovery):
        calls = 0

        def find_available_hosts_and_slots(self):
            OneSlot.calls += 1
            hosts = super().find_available_hosts_and_slots()
            return {h: 1 for h in list(hosts)[:1]}

    settings = RayExecutor.create_settings(timeout_s=60)
    settings.discovery = OneSlot(use_gpu=False, cpus_per_slot=1)
    ex = RayExecutor(settings, min_workers=1, max_workers=2, override_discovery=False,
                     elastic_timeout=60)
    ex.start(extra_env_vars={"TFHVD_TEST_ENGINE_VAR": "elastic"})
    with tempfile.TemporaryDirectory() as d:
        results = ex.run(jobs.elastic_training, args=[d, 5])
    assert [(r["size"], r["batch"]) for r in results] == [(1, 5)], results
    assert OneSlot.calls >= 1
    no_discovery = ElasticRayExecutor(ElasticRayExecutor.create_settings(),
                                      override_discovery=False)
    with pytest.raises(ValueError, match="needs settings.discovery"):
        no_discovery.start()


def test_keras_fit_weights_equal_tfhvdrun():
    ref = jobs.reference_weights(epochs=2)
    ex = _executor()
    try:
        res = ex.run(jobs.bench.train, kwargs={"epochs": 2})
    finally:
        ex.shutdown()
    got = [np.array(w) for w in res[0]["weights"]]
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_raise_on_one_rank_names_it_with_traceback():
    ex = _executor()
    pids = _actor_pids(ex)
    group = ex._pg.id.hex()
    with pytest.raises(WorkerError) as info:
        ex.run(jobs.fails_on_rank_one)
    e = info.value
    assert e.rank == 1
    assert "rank 1 raised ValueError: rank one's deliberate failure" in str(e)
    assert "fails_on_rank_one" in e.worker_traceback
    assert jobs.wait_gone(pids) == [], "the job's actors outlived its failure"
    # The failed job gave back its placement group (a start() after it waited
    # for CPUs the orphaned group held, then timed out), and start() again works.
    assert ray.util.placement_group_table()[group]["state"] == "REMOVED"
    ex.start()
    try:
        jobs.check_collectives(ex.run(jobs.collectives, args=["again"]), "again")
    finally:
        ex.shutdown()


def test_killed_actor_ends_the_job_within_30s():
    ex = _executor()
    pids = _actor_pids(ex)
    with tempfile.TemporaryDirectory() as d:
        refs = ex.run_remote(jobs.train_until_killed, args=[d])
        jobs.wait_pids(d, 2)
        t0 = time.time()
        jobs.kill(pids[1])
        with pytest.raises(WorkerError) as info:
            from tfhvd.ray.runner import wait_refs
            wait_refs(refs, ex._stop_workers)
        took = time.time() - t0
    assert took < 30, "the job took %.1f s to end" % took
    assert info.value.rank == 1
    assert "worker of rank 1 died" in str(info.value)
    assert jobs.wait_gone(pids) == [], "actors outlived the failed job"
    ex.shutdown()


def test_elastic_executor_recovers_from_a_killed_worker():
    with tempfile.TemporaryDirectory() as d:
        settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2, timeout_s=60,
                                                      elastic_timeout=60)
        ex = ElasticRayExecutor(settings, cpus_per_slot=1)
        ex.start()
        killer = threading.Thread(target=_kill_one_once, args=(d,), daemon=True)
        killer.start()
        results = ex.run(jobs.elastic_training, args=[d, 30])
        killer.join(timeout=5)
    assert len(results) == 2, results
    assert all(r["batch"] == 30 and r["weight"] == 30.0 and r["size"] == 2
               for r in results), results
    assert any(r["resets"] >= 1 for r in results), results
    assert all(r["own_session"] for r in results), results
    left = jobs.wait_for(lambda: not jobs.pids_matching("ray::ElasticWorker"), timeout=30)
    assert left, "elastic workers outlived the job: %r" % jobs.pids_matching("ray::ElasticWorker")


def _kill_one_once(d: str) -> None:
    pids = jobs.wait_pids(d, 2)
    time.sleep(2)
    jobs.kill(pids[1])


def test_engines_are_optional_extras():
    """``import tfhvd`` loads neither engine; without one, its package says
    which extra installs it."""
    import subprocess

    code = ("import sys\n"
            "import tfhvd, tfhvd.tensorflow, tfhvd.runner\n"
            "assert 'ray' not in sys.modules and 'pyspark' not in sys.modules\n"
            "sys.modules['ray'] = None\n"
            "sys.modules['pyspark'] = None\n"
            "for mod, req, extra in (('tfhvd.ray', 'ray>=2.10', 'tfhvd[ray]'),\n"
            "                       ('tfhvd.spark', 'pyspark>=3.5', 'tfhvd[spark]')):\n"
            "    try:\n"
            "        __import__(mod)\n"
            "    except ImportError as e:\n"
            "        assert 'pip install \"' + req + '\"' in str(e), str(e)\n"
            "        assert 'pip install --no-build-isolation \"/path/to/' + extra + '\"' in str(e), str(e)\n"
            "    else:\n"
            "        raise SystemExit(mod + ' imported without its engine')\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
