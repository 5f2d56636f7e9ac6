"""Task handles: what ``@worker.task(...)`` returns, so a producer can enqueue a
task by its function (``send.enqueue({"to": ...}, client=client)``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtq_pyworker._requests import EnqueueResult
    from dtq_pyworker.client import AsyncClient, Client


class TaskHandle:
    """A registered handler that can also be enqueued.

    Calling the handle calls the handler itself (``send(payload, ctx)``), so tests
    and other code keep using the function as before.

    Attributes:
        fn: The handler function.
        task_type: The task type it is registered for.
        queue: Default queue of :meth:`enqueue` (the worker's first queue).
    """

    def __init__(self, fn: Callable[..., Any], task_type: str, queue: str,
                 client_factory: Callable[[], Client] | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.task_type = task_type
        self.queue = queue
        self._client_factory = client_factory

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_type!r}, queue={self.queue!r}, fn={self.fn!r})"

    def enqueue(self, payload: Any = None, *, client: Client | AsyncClient | None = None,
                queue: str | None = None, **options: Any) -> Any:
        """Enqueue one task of this type.

        Args:
            payload: JSON-encodable value, or bytes sent as-is.
            client: A :class:`Client`, or an :class:`AsyncClient` (then the call
                returns a coroutine to await). None = a blocking Client made once
                from the worker's gateway address and credentials.
            queue: Queue to enqueue to; default :attr:`queue`.
            **options: Enqueue options of :meth:`Client.enqueue` (priority,
                delay_ms, idempotency_key, max_attempts, ...).

        Returns:
            EnqueueResult (or a coroutine of one for an AsyncClient).

        Raises:
            DtqRpcError: The gateway refused the task.
        """
        if client is None:
            if self._client_factory is None:
                raise ValueError("no client given and the handle has no default client")
            client = self._client_factory()
        return client.enqueue(queue or self.queue, self.task_type, payload, **options)

    def using(self, client: Client | AsyncClient) -> Callable[..., EnqueueResult]:
        """``enqueue`` bound to ``client``: ``send.using(client)({"to": ...})``."""
        return functools.partial(self.enqueue, client=client)
