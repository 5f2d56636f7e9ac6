"""The demo worker: ``dtq-pyworker examples.demo.handlers:worker``.

Four task types on queue ``demo`` (see ``examples/demo/producer.py``):

- ``file.stats``: count lines and words of a file and hash it.
- ``file.flaky``: fail (retryably) while the attempt is <= ``fail_attempts``,
  then behave like ``file.stats``; shows retries with backoff.
- ``file.poison``: always fail retryably; ends in the dead-letter queue once its
  attempts are spent.
- ``file.corrupt``: fail with :class:`~dtq_pyworker.PermanentError`; dead-lettered
  at once, without a retry.

Every result carries ``"worker_lang": "python"`` so the summary can show which
worker implementation ran each task.
"""

from __future__ import annotations

import logging
from typing import Any

from dtq_pyworker import PermanentError, TaskContext, Worker
from examples.demo.textstats import file_stats

log = logging.getLogger(__name__)

QUEUE = "demo"
WORKER_LANG = "python"


class FlakyError(RuntimeError):
    """A deliberate, retryable failure of ``file.flaky`` and ``file.poison``."""


#: The CLI's --target/--queues/--concurrency (env DTQ_GATEWAY, DTQ_QUEUES,
#: DTQ_CONCURRENCY) override these defaults.
worker = Worker(
    queues=[QUEUE],
    concurrency=8,
    labels={"lang": WORKER_LANG, "app": "dtq-demo"},
)


def _stats(payload: dict[str, Any]) -> dict[str, Any]:
    result = file_stats(payload["path"])
    result["worker_lang"] = WORKER_LANG
    return result


@worker.task("file.stats")
def stats(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Lines, words, sha256 and top words of ``payload["path"]``."""
    return _stats(payload)


@worker.task("file.flaky")
def flaky(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Fail while ``ctx.attempt <= payload["fail_attempts"]``, then count the file.

    Raises:
        FlakyError: On the first ``fail_attempts`` attempts (retryable).
    """
    if ctx.attempt <= int(payload.get("fail_attempts", 1)):
        raise FlakyError(f"flaky failure on attempt {ctx.attempt}")
    return _stats(payload)


@worker.task("file.poison")
def poison(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Always fail retryably, so the task ends in the dead-letter queue.

    Raises:
        FlakyError: Always.
    """
    raise FlakyError(f"poison task failed on attempt {ctx.attempt} of {ctx.max_attempts}")


@worker.task("file.corrupt")
def corrupt(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """Fail permanently: the task is dead-lettered without a retry.

    Raises:
        PermanentError: Always.
    """
    raise PermanentError(f"refusing {payload.get('path', '?')}: marked corrupt")
