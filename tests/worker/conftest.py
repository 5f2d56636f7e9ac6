"""Fixtures for worker tests: a FakeBroker served in-process on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.worker.fake_broker import FakeBroker, start_server


@pytest.fixture
async def fake() -> AsyncIterator[FakeBroker]:
    """A FakeBroker on 127.0.0.1:<free port>; its address is ``fake.target``."""
    broker = FakeBroker()
    server, target = await start_server(broker)
    broker.target = target
    yield broker
    await server.stop(None)
