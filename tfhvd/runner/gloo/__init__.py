"""Running jobs without mpirun (``tfhvdrun --gloo``), in reusable pieces:

* :class:`.rendezvous.RendezvousServer`: the HTTP key-value store the ranks
  meet on (one server, any number of scopes: one per ``hvd.init()``);
* :mod:`.workers`: ``plan_slots`` (where each rank runs), ``worker_env`` (its
  environment, scope included), ``remote_command`` (ssh under the guard) and
  ``Worker`` (one rank's process);
* :class:`.job.GlooJob`: spawn ranks, watch their exits (``on_exit``,
  ``stop_on_failure``), stop them all; :func:`.job.run_gloo_job` is what
  ``tfhvdrun --gloo`` runs.

An elastic driver can start a server, spawn workers with
``worker_env(..., scope=...)`` and watch them with ``GlooJob.wait``.
"""
