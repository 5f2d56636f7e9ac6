"""The Lua scripts of the Admin service and the audit stream.

Scripts that append to the audit stream get ``_audit.lua`` prepended after
``_lib.lua``, so the audit XADD runs inside the same script as the state change
it records (one atomic step). Other modules that need the same (e.g. the cancel
script of the Broker) can build theirs with :class:`AuditedScript`.
"""

from __future__ import annotations

from dtq_gateway.store.scripts import Script


class AuditedScript(Script):
    """A :class:`Script` whose source also includes the ``audit()`` Lua helper."""

    def __init__(self, name: str, allow_oom: bool = False) -> None:
        super().__init__(name, helpers=("_audit",), allow_oom=allow_oom)


AUDIT_APPEND = AuditedScript("audit_append", allow_oom=True)
PAUSE_QUEUE = AuditedScript("pause_queue", allow_oom=True)
REQUEUE_DEAD_LETTER = AuditedScript("requeue_dead_letter")
DISCARD_DEAD_LETTER = AuditedScript("discard_dead_letter", allow_oom=True)
PURGE_DEAD_LETTERS = AuditedScript("purge_dead_letters", allow_oom=True)
DLQ_SCAN = Script("dlq_scan")
TASK_SUMMARIES = Script("task_summaries")
QUEUE_SUMMARIES = Script("queue_summaries")
QUEUE_WAITING = Script("queue_waiting")
