"""``BaseHorovodWorker``: the worker interface of Horovod's ``horovod.ray.worker``.

Horovod's Ray workers are actors of this class; users subclass it for
actors of their own that hold an executable object.  tfhvd's
``RayExecutor`` workers are actors of a subclass (tfhvd.ray.runner), so they
answer these methods as well.
"""

import os
import socket
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray


class BaseHorovodWorker:
    """One rank's actor: its environment and an optional executable object.

    ``world_rank`` and ``world_size`` become ``HOROVOD_RANK``/``HOROVOD_SIZE``
    (and the host name ``HOROVOD_HOSTNAME``) in the actor's environment.
    """

    executable: Any = None

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        os.environ["HOROVOD_HOSTNAME"] = self.hostname()
        os.environ["HOROVOD_RANK"] = str(int(world_rank))
        os.environ["HOROVOD_SIZE"] = str(int(world_size))
        self.queue: Any = None

    def hostname(self) -> str:
        """The host this actor runs on."""
        return socket.gethostname()

    def get_gpu_ids(self) -> List[int]:
        """The CUDA device ids Ray gave this actor."""
        return list(ray.get_gpu_ids())

    def update_env_vars(self, env_vars: Dict[str, Any]) -> None:
        """Sets variables of the actor's environment (values as strings)."""
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> Dict[str, str]:
        """The actor's environment."""
        return dict(os.environ)

    def start_executable(self, executable_cls: Optional[type] = None,
                         executable_args: Optional[Sequence] = None,
                         executable_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Makes ``executable_cls(*args, **kwargs)`` this actor's executable
        (nothing when ``executable_cls`` is None)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()),
                                             **(executable_kwargs or {}))

    def execute(self, func: Callable[[Any], Any]) -> Any:
        """``func(executable)`` on this actor."""
        return func(self.executable)

    def set_queue(self, queue: Any) -> None:
        """Keeps a queue for the actor's log lines (Horovod's multi-node logging);
        tfhvd forwards output through Ray's own log streaming."""
        self.queue = queue
