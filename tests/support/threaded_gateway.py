"""A real gateway (and optionally a Python worker) served from a background thread's
event loop, for tests whose code under test blocks: the ``dtq`` CLI through
click's CliRunner, the Node producer through ``node --test``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from dtq_pyworker import ConnectConfig, Worker

ADMIN_TOKEN = "admin-token-0001"
PRODUCER_TOKEN = "producer-token-0001"
WORKER_TOKEN = "worker-token-0001"
AUTH_TOKENS = (f"{ADMIN_TOKEN}=admin:ops,{PRODUCER_TOKEN}=producer:shop,"
               f"{WORKER_TOKEN}=worker:w")


class ThreadedGateway:
    """Gateway on 127.0.0.1:<free port> run by its own loop thread.

    Args:
        redis_url: Private Redis of the test.
        auth: Turn tokens on (:data:`AUTH_TOKENS`).
        **overrides: Gateway settings (as ``tests.conftest.gateway_settings``).
    """

    def __init__(self, redis_url: str, *, auth: bool = False, **overrides: Any) -> None:
        self.redis_url = redis_url
        self.auth = auth
        self.overrides = overrides
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-gateway",
                                        daemon=True)
        self._workers: list[tuple[Worker, asyncio.Future]] = []
        self.gateway: Any = None

    @property
    def target(self) -> str:
        """host:port of the gateway."""
        return f"127.0.0.1:{self.gateway.port}"

    def call(self, coro: Coroutine, timeout_s: float = 20.0) -> Any:
        """Run ``coro`` on the gateway's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def start(self) -> ThreadedGateway:
        """Start the loop thread and the gateway."""
        from dtq_gateway.server import Gateway
        from tests.conftest import gateway_settings

        overrides = dict(self.overrides)
        if self.auth:
            overrides["auth_tokens"] = AUTH_TOKENS
        settings = gateway_settings(self.redis_url, **overrides)

        async def make() -> Gateway:  # grpc.aio objects belong to the loop that makes them
            gateway = Gateway(settings, self.redis_url)
            await gateway.start()
            return gateway

        self._thread.start()
        self.gateway = self.call(make())
        return self

    def run_worker(self, queues: list[str], handlers: dict[str, Callable],
                   **kwargs: Any) -> Worker:
        """Run a Python Worker with ``handlers`` on the gateway's loop until :meth:`stop`."""
        kwargs.setdefault("drain_grace_s", 2)
        token = kwargs.pop("token", WORKER_TOKEN if self.auth else None)
        worker = Worker(queues, ConnectConfig(self.target, token=token), **kwargs)
        for task_type, fn in handlers.items():
            worker.register(task_type, fn)
        future = asyncio.run_coroutine_threadsafe(
            worker.run_async(install_signal_handlers=False), self.loop)
        future.add_done_callback(lambda f: f.exception())  # surfaced again by stop()
        self._workers.append((worker, future))
        return worker

    def stop(self) -> None:
        """Drain the workers, stop the gateway and the loop thread."""
        for worker, future in self._workers:
            worker.stop()
            future.result(15)
        if self.gateway is not None:
            self.call(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
