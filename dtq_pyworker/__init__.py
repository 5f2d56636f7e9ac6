"""dtq_pyworker: the reference dtq worker and producer client.

Example::

    from dtq_pyworker import Worker

    worker = Worker(queues=["demo"])

    @worker.task("file.stats")
    def file_stats(payload, ctx):
        return {"path": payload["path"]}

    worker.run()
"""

from dtq_pyworker._requests import TERMINAL_STATUSES, EnqueueResult, GroupResult
from dtq_pyworker._version import __version__
from dtq_pyworker.admin import AdminClient
from dtq_pyworker.client import AsyncClient, Client
from dtq_pyworker.connect import ConnectConfig, TLSConfig
from dtq_pyworker.context import TaskContext
from dtq_pyworker.errors import DtqRpcError, PermanentError, Retry
from dtq_pyworker.handle import TaskHandle
from dtq_pyworker.tasks import (
    Attempt,
    CancelResult,
    ChainState,
    Task,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskNotSucceeded,
    TaskStatus,
    TaskWaitTimeout,
)
from dtq_pyworker.worker import Worker

__all__ = [
    "TERMINAL_STATUSES",
    "AdminClient",
    "AsyncClient",
    "Attempt",
    "CancelResult",
    "ChainState",
    "Client",
    "ConnectConfig",
    "DtqRpcError",
    "EnqueueResult",
    "GroupResult",
    "PermanentError",
    "Retry",
    "TLSConfig",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskExpired",
    "TaskFailed",
    "TaskHandle",
    "TaskNotSucceeded",
    "TaskStatus",
    "TaskWaitTimeout",
    "Worker",
    "__version__",
]
