"""A process's rank and size read from its launcher's environment, before
``hvd.init()``: Horovod's ``horovod.runner.common.util.env``, which scripts
such as Horovod's tf.data service example import.

Importing this module loads no TensorFlow and no launcher module.
"""

import os
from typing import Tuple

# Each launcher's pair of variables, in the order they are looked for:
# tfhvdrun --gloo, the elastic and engine launchers (and Horovod's), then
# Open MPI's mpirun, then PMI launchers (MPICH, Intel MPI, Slurm's srun).
_RANK_AND_SIZE = (("HOROVOD_RANK", "HOROVOD_SIZE"),
                  ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                  ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size() -> Tuple[int, int]:
    """``(rank, size)`` from the first launcher whose two variables are set;
    ``(0, 1)`` when no launcher set any (a plain ``python train.py``).

    Raises RuntimeError when only one variable of a pair is set, or when a
    value is not a number, naming the variable.
    """
    for rank_var, size_var in _RANK_AND_SIZE:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise RuntimeError(
                "cannot tell this process's rank and size: %s is set but %s is not"
                % ((rank_var, size_var) if size is None else (size_var, rank_var)))
        try:
            return int(rank), int(size)
        except ValueError:
            raise RuntimeError("cannot tell this process's rank and size: %s=%r, %s=%r "
                               "are not whole numbers" % (rank_var, rank, size_var, size)
                               ) from None
    return 0, 1
