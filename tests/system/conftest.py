"""Fixtures of the chaos suite (tests/system/test_chaos_*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.chaos_invariant import ChaosEnv


@pytest.fixture
def chaos(tmp_path: Path) -> Iterator[ChaosEnv]:
    """A private redis-server (AOF), an event recorder, and cleanup of every process."""
    env = ChaosEnv(tmp_path)
    try:
        yield env
    finally:
        env.cleanup()
