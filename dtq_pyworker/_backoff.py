"""Jittered exponential backoff for reconnects and retried calls."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``initial_s`` up to ``max_s``, with jitter.

    Each delay is uniform in [d/2, d] where d is the current step, so many
    workers that lost the same gateway do not reconnect in lock step.

    Args:
        initial_s: First step in seconds.
        max_s: Largest step in seconds.
    """

    def __init__(self, initial_s: float = 0.1, max_s: float = 5.0) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._step = initial_s

    def next(self) -> float:
        """Return the next delay in seconds and double the step (up to max_s)."""
        step = self._step
        self._step = min(self.max_s, step * 2)
        return random.uniform(step / 2, step)

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a success)."""
        self._step = self.initial_s
