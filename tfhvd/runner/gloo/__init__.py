"""Running jobs without mpirun (``tfhvdrun --gloo``): a rendezvous server
(:mod:`.rendezvous`), the workers' environment and their processes, local or
over ssh (:mod:`.workers`), and the job that ties them together
(:mod:`.job`).  Each piece is usable on its own, e.g. by an elastic driver."""
