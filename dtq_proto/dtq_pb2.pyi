from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_QUEUED: _ClassVar[TaskStatus]
    TASK_STATUS_SCHEDULED: _ClassVar[TaskStatus]
    TASK_STATUS_ACTIVE: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_DEAD_LETTERED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_EXPIRED: _ClassVar[TaskStatus]

class DebounceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEBOUNCE_MODE_UNSPECIFIED: _ClassVar[DebounceMode]
    DEBOUNCE_MODE_KEEP_FIRST: _ClassVar[DebounceMode]
    DEBOUNCE_MODE_KEEP_LAST: _ClassVar[DebounceMode]

class FailMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAIL_MODE_UNSPECIFIED: _ClassVar[FailMode]
    FAIL_MODE_FAILURE: _ClassVar[FailMode]
    FAIL_MODE_RELEASE: _ClassVar[FailMode]
    FAIL_MODE_CANCELLED: _ClassVar[FailMode]

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_TASK_QUEUED: _ClassVar[EventType]
    EVENT_TYPE_TASK_STARTED: _ClassVar[EventType]
    EVENT_TYPE_TASK_SUCCEEDED: _ClassVar[EventType]
    EVENT_TYPE_TASK_FAILED: _ClassVar[EventType]
    EVENT_TYPE_TASK_RETRY_SCHEDULED: _ClassVar[EventType]
    EVENT_TYPE_TASK_RETRIED: _ClassVar[EventType]
    EVENT_TYPE_TASK_DEAD_LETTERED: _ClassVar[EventType]
    EVENT_TYPE_TASK_CANCELLED: _ClassVar[EventType]
    EVENT_TYPE_WORKER_STARTED: _ClassVar[EventType]
    EVENT_TYPE_WORKER_STOPPED: _ClassVar[EventType]
    EVENT_TYPE_WORKER_STALE: _ClassVar[EventType]
    EVENT_TYPE_CONFIGURATION_CHANGED: _ClassVar[EventType]
    EVENT_TYPE_TASK_EXPIRED: _ClassVar[EventType]
    EVENT_TYPE_TASK_DUPLICATE_ABSORBED: _ClassVar[EventType]
    EVENT_TYPE_TASK_PROGRESS: _ClassVar[EventType]

class ScheduleCatchUp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_CATCH_UP_UNSPECIFIED: _ClassVar[ScheduleCatchUp]
    SCHEDULE_CATCH_UP_SKIP: _ClassVar[ScheduleCatchUp]
    SCHEDULE_CATCH_UP_LATEST: _ClassVar[ScheduleCatchUp]
    SCHEDULE_CATCH_UP_ALL: _ClassVar[ScheduleCatchUp]

class ChainState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHAIN_STATE_UNSPECIFIED: _ClassVar[ChainState]
    CHAIN_STATE_WAITING: _ClassVar[ChainState]
    CHAIN_STATE_CONTINUING: _ClassVar[ChainState]
    CHAIN_STATE_CONTINUED: _ClassVar[ChainState]
    CHAIN_STATE_BROKEN: _ClassVar[ChainState]
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_QUEUED: TaskStatus
TASK_STATUS_SCHEDULED: TaskStatus
TASK_STATUS_ACTIVE: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_DEAD_LETTERED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_EXPIRED: TaskStatus
DEBOUNCE_MODE_UNSPECIFIED: DebounceMode
DEBOUNCE_MODE_KEEP_FIRST: DebounceMode
DEBOUNCE_MODE_KEEP_LAST: DebounceMode
FAIL_MODE_UNSPECIFIED: FailMode
FAIL_MODE_FAILURE: FailMode
FAIL_MODE_RELEASE: FailMode
FAIL_MODE_CANCELLED: FailMode
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_TASK_QUEUED: EventType
EVENT_TYPE_TASK_STARTED: EventType
EVENT_TYPE_TASK_SUCCEEDED: EventType
EVENT_TYPE_TASK_FAILED: EventType
EVENT_TYPE_TASK_RETRY_SCHEDULED: EventType
EVENT_TYPE_TASK_RETRIED: EventType
EVENT_TYPE_TASK_DEAD_LETTERED: EventType
EVENT_TYPE_TASK_CANCELLED: EventType
EVENT_TYPE_WORKER_STARTED: EventType
EVENT_TYPE_WORKER_STOPPED: EventType
EVENT_TYPE_WORKER_STALE: EventType
EVENT_TYPE_CONFIGURATION_CHANGED: EventType
EVENT_TYPE_TASK_EXPIRED: EventType
EVENT_TYPE_TASK_DUPLICATE_ABSORBED: EventType
EVENT_TYPE_TASK_PROGRESS: EventType
SCHEDULE_CATCH_UP_UNSPECIFIED: ScheduleCatchUp
SCHEDULE_CATCH_UP_SKIP: ScheduleCatchUp
SCHEDULE_CATCH_UP_LATEST: ScheduleCatchUp
SCHEDULE_CATCH_UP_ALL: ScheduleCatchUp
CHAIN_STATE_UNSPECIFIED: ChainState
CHAIN_STATE_WAITING: ChainState
CHAIN_STATE_CONTINUING: ChainState
CHAIN_STATE_CONTINUED: ChainState
CHAIN_STATE_BROKEN: ChainState

class RetryPolicy(_message.Message):
    __slots__ = ("backoff_base_ms", "backoff_cap_ms")
    BACKOFF_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_CAP_MS_FIELD_NUMBER: _ClassVar[int]
    backoff_base_ms: int
    backoff_cap_ms: int
    def __init__(self, backoff_base_ms: _Optional[int] = ..., backoff_cap_ms: _Optional[int] = ...) -> None: ...

class EnqueueRequest(_message.Message):
    __slots__ = ("queue", "task_type", "payload", "content_type", "priority", "max_attempts", "timeout_ms", "idempotency_key", "delay_ms", "not_before_ms", "expires_at_ms", "ttl_ms", "retry_policy", "metadata", "traceparent", "tracestate", "chain", "debounce", "concurrency_key", "required_labels")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RequiredLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_LABELS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    task_type: str
    payload: bytes
    content_type: str
    priority: int
    max_attempts: int
    timeout_ms: int
    idempotency_key: str
    delay_ms: int
    not_before_ms: int
    expires_at_ms: int
    ttl_ms: int
    retry_policy: RetryPolicy
    metadata: _containers.ScalarMap[str, str]
    traceparent: str
    tracestate: str
    chain: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    debounce: Debounce
    concurrency_key: str
    required_labels: _containers.ScalarMap[str, str]
    def __init__(self, queue: _Optional[str] = ..., task_type: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., priority: _Optional[int] = ..., max_attempts: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., delay_ms: _Optional[int] = ..., not_before_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ..., chain: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., debounce: _Optional[_Union[Debounce, _Mapping]] = ..., concurrency_key: _Optional[str] = ..., required_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Debounce(_message.Message):
    __slots__ = ("key", "window_ms", "mode", "max_delay_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    window_ms: int
    mode: DebounceMode
    max_delay_ms: int
    def __init__(self, key: _Optional[str] = ..., window_ms: _Optional[int] = ..., mode: _Optional[_Union[DebounceMode, str]] = ..., max_delay_ms: _Optional[int] = ...) -> None: ...

class EnqueueResponse(_message.Message):
    __slots__ = ("task_id", "deduplicated", "status", "chain_task_ids", "debounced")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    deduplicated: bool
    status: TaskStatus
    chain_task_ids: _containers.RepeatedScalarFieldContainer[str]
    debounced: bool
    def __init__(self, task_id: _Optional[str] = ..., deduplicated: _Optional[bool] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., chain_task_ids: _Optional[_Iterable[str]] = ..., debounced: _Optional[bool] = ...) -> None: ...

class EnqueueBatchRequest(_message.Message):
    __slots__ = ("items", "group_callback")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    GROUP_CALLBACK_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EnqueueRequest]
    group_callback: EnqueueRequest
    def __init__(self, items: _Optional[_Iterable[_Union[EnqueueRequest, _Mapping]]] = ..., group_callback: _Optional[_Union[EnqueueRequest, _Mapping]] = ...) -> None: ...

class EnqueueBatchResponse(_message.Message):
    __slots__ = ("results", "group_id", "group_callback_task_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_CALLBACK_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EnqueueBatchResult]
    group_id: str
    group_callback_task_id: str
    def __init__(self, results: _Optional[_Iterable[_Union[EnqueueBatchResult, _Mapping]]] = ..., group_id: _Optional[str] = ..., group_callback_task_id: _Optional[str] = ...) -> None: ...

class EnqueueBatchResult(_message.Message):
    __slots__ = ("task_id", "deduplicated", "status", "error", "chain_task_ids", "debounced")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHAIN_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCED_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    deduplicated: bool
    status: TaskStatus
    error: ItemError
    chain_task_ids: _containers.RepeatedScalarFieldContainer[str]
    debounced: bool
    def __init__(self, task_id: _Optional[str] = ..., deduplicated: _Optional[bool] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ..., chain_task_ids: _Optional[_Iterable[str]] = ..., debounced: _Optional[bool] = ...) -> None: ...

class ItemError(_message.Message):
    __slots__ = ("code", "reason", "message", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    message: str
    field: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("worker_id", "queues", "task_types", "max_in_flight", "hostname", "labels", "concurrency", "sdk", "max_batch", "accept_cancel_notices")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SDK_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CANCEL_NOTICES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    max_in_flight: int
    hostname: str
    labels: _containers.ScalarMap[str, str]
    concurrency: int
    sdk: str
    max_batch: int
    accept_cancel_notices: bool
    def __init__(self, worker_id: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ..., max_in_flight: _Optional[int] = ..., hostname: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., concurrency: _Optional[int] = ..., sdk: _Optional[str] = ..., max_batch: _Optional[int] = ..., accept_cancel_notices: _Optional[bool] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("session", "task", "batch", "cancelled")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    session: SessionInfo
    task: LeasedTask
    batch: LeasedTaskBatch
    cancelled: LeaseCancelled
    def __init__(self, session: _Optional[_Union[SessionInfo, _Mapping]] = ..., task: _Optional[_Union[LeasedTask, _Mapping]] = ..., batch: _Optional[_Union[LeasedTaskBatch, _Mapping]] = ..., cancelled: _Optional[_Union[LeaseCancelled, _Mapping]] = ...) -> None: ...

class LeaseCancelled(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LeasedTaskBatch(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[LeasedTask]
    def __init__(self, tasks: _Optional[_Iterable[_Union[LeasedTask, _Mapping]]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "heartbeat_interval_ms", "visibility_timeout_ms", "max_in_flight", "gateway_id", "result_max_bytes", "lease_grace_ms", "max_batch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASE_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    heartbeat_interval_ms: int
    visibility_timeout_ms: int
    max_in_flight: int
    gateway_id: str
    result_max_bytes: int
    lease_grace_ms: int
    max_batch: int
    def __init__(self, session_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., visibility_timeout_ms: _Optional[int] = ..., max_in_flight: _Optional[int] = ..., gateway_id: _Optional[str] = ..., result_max_bytes: _Optional[int] = ..., lease_grace_ms: _Optional[int] = ..., max_batch: _Optional[int] = ...) -> None: ...

class LeasedTask(_message.Message):
    __slots__ = ("lease_id", "task_id", "queue", "task_type", "payload", "content_type", "priority", "attempt", "max_attempts", "timeout_ms", "idempotency_key", "metadata", "created_at_ms", "leased_at_ms", "traceparent", "tracestate")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    task_id: str
    queue: str
    task_type: str
    payload: bytes
    content_type: str
    priority: int
    attempt: int
    max_attempts: int
    timeout_ms: int
    idempotency_key: str
    metadata: _containers.ScalarMap[str, str]
    created_at_ms: int
    leased_at_ms: int
    traceparent: str
    tracestate: str
    def __init__(self, lease_id: _Optional[str] = ..., task_id: _Optional[str] = ..., queue: _Optional[str] = ..., task_type: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., priority: _Optional[int] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., created_at_ms: _Optional[int] = ..., leased_at_ms: _Optional[int] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class WorkerCounters(_message.Message):
    __slots__ = ("tasks_processed", "tasks_failed", "tasks_retried")
    TASKS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TASKS_RETRIED_FIELD_NUMBER: _ClassVar[int]
    tasks_processed: int
    tasks_failed: int
    tasks_retried: int
    def __init__(self, tasks_processed: _Optional[int] = ..., tasks_failed: _Optional[int] = ..., tasks_retried: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "lease_ids", "counters", "active_tasks", "concurrency", "hostname", "draining", "progress")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    counters: WorkerCounters
    active_tasks: int
    concurrency: int
    hostname: str
    draining: bool
    progress: _containers.RepeatedCompositeFieldContainer[TaskProgress]
    def __init__(self, worker_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[str]] = ..., counters: _Optional[_Union[WorkerCounters, _Mapping]] = ..., active_tasks: _Optional[int] = ..., concurrency: _Optional[int] = ..., hostname: _Optional[str] = ..., draining: _Optional[bool] = ..., progress: _Optional[_Iterable[_Union[TaskProgress, _Mapping]]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lost_lease_ids", "cancelled_lease_ids", "heartbeat_interval_ms")
    LOST_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    lost_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    cancelled_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    heartbeat_interval_ms: int
    def __init__(self, lost_lease_ids: _Optional[_Iterable[str]] = ..., cancelled_lease_ids: _Optional[_Iterable[str]] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[AckItem]
    def __init__(self, items: _Optional[_Iterable[_Union[AckItem, _Mapping]]] = ...) -> None: ...

class AckItem(_message.Message):
    __slots__ = ("lease_id", "result")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    result: bytes
    def __init__(self, lease_id: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LeaseResult]
    def __init__(self, results: _Optional[_Iterable[_Union[LeaseResult, _Mapping]]] = ...) -> None: ...

class LeaseResult(_message.Message):
    __slots__ = ("lease_id", "duplicate", "error", "status")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    duplicate: bool
    error: ItemError
    status: TaskStatus
    def __init__(self, lease_id: _Optional[str] = ..., duplicate: _Optional[bool] = ..., error: _Optional[_Union[ItemError, _Mapping]] = ..., status: _Optional[_Union[TaskStatus, str]] = ...) -> None: ...

class FailRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[FailItem]
    def __init__(self, items: _Optional[_Iterable[_Union[FailItem, _Mapping]]] = ...) -> None: ...

class FailItem(_message.Message):
    __slots__ = ("lease_id", "error_message", "error_class", "retryable", "retry_after_ms", "mode")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    error_message: str
    error_class: str
    retryable: bool
    retry_after_ms: int
    mode: FailMode
    def __init__(self, lease_id: _Optional[str] = ..., error_message: _Optional[str] = ..., error_class: _Optional[str] = ..., retryable: _Optional[bool] = ..., retry_after_ms: _Optional[int] = ..., mode: _Optional[_Union[FailMode, str]] = ...) -> None: ...

class FailResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[LeaseResult]
    def __init__(self, results: _Optional[_Iterable[_Union[LeaseResult, _Mapping]]] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "queue", "task_type", "payload", "content_type", "priority", "status", "attempt", "max_attempts", "timeout_ms", "idempotency_key", "metadata", "created_at_ms", "not_before_ms", "expires_at_ms", "started_at_ms", "finished_at_ms", "worker_id", "last_error", "last_error_class", "result", "result_truncated", "attempts", "cancel_requested", "retry_policy", "updated_at_ms", "due_at_ms", "progress_percent", "progress_message", "progress_at_ms", "chain_id", "chain_step", "next_task_id", "chain_state", "group_id", "traceparent", "concurrency_key", "parked", "required_labels")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class RequiredLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    RESULT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DUE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_PERCENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_STEP_FIELD_NUMBER: _ClassVar[int]
    NEXT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHAIN_STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_LABELS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    queue: str
    task_type: str
    payload: bytes
    content_type: str
    priority: int
    status: TaskStatus
    attempt: int
    max_attempts: int
    timeout_ms: int
    idempotency_key: str
    metadata: _containers.ScalarMap[str, str]
    created_at_ms: int
    not_before_ms: int
    expires_at_ms: int
    started_at_ms: int
    finished_at_ms: int
    worker_id: str
    last_error: str
    last_error_class: str
    result: bytes
    result_truncated: bool
    attempts: _containers.RepeatedCompositeFieldContainer[AttemptRecord]
    cancel_requested: bool
    retry_policy: RetryPolicy
    updated_at_ms: int
    due_at_ms: int
    progress_percent: float
    progress_message: str
    progress_at_ms: int
    chain_id: str
    chain_step: int
    next_task_id: str
    chain_state: ChainState
    group_id: str
    traceparent: str
    concurrency_key: str
    parked: bool
    required_labels: _containers.ScalarMap[str, str]
    def __init__(self, task_id: _Optional[str] = ..., queue: _Optional[str] = ..., task_type: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., priority: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., created_at_ms: _Optional[int] = ..., not_before_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., worker_id: _Optional[str] = ..., last_error: _Optional[str] = ..., last_error_class: _Optional[str] = ..., result: _Optional[bytes] = ..., result_truncated: _Optional[bool] = ..., attempts: _Optional[_Iterable[_Union[AttemptRecord, _Mapping]]] = ..., cancel_requested: _Optional[bool] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., updated_at_ms: _Optional[int] = ..., due_at_ms: _Optional[int] = ..., progress_percent: _Optional[float] = ..., progress_message: _Optional[str] = ..., progress_at_ms: _Optional[int] = ..., chain_id: _Optional[str] = ..., chain_step: _Optional[int] = ..., next_task_id: _Optional[str] = ..., chain_state: _Optional[_Union[ChainState, str]] = ..., group_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., concurrency_key: _Optional[str] = ..., parked: _Optional[bool] = ..., required_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AttemptRecord(_message.Message):
    __slots__ = ("attempt", "worker_id", "started_at_ms", "finished_at_ms", "outcome", "error_message", "error_class")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    worker_id: str
    started_at_ms: int
    finished_at_ms: int
    outcome: str
    error_message: str
    error_class: str
    def __init__(self, attempt: _Optional[int] = ..., worker_id: _Optional[str] = ..., started_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., error_message: _Optional[str] = ..., error_class: _Optional[str] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("status", "cancel_requested", "request_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    status: TaskStatus
    cancel_requested: bool
    request_id: str
    def __init__(self, status: _Optional[_Union[TaskStatus, str]] = ..., cancel_requested: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueSummary]
    next_page_token: str
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueSummary, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QueueSummary(_message.Message):
    __slots__ = ("name", "depth", "pending", "paused")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    depth: int
    pending: int
    paused: bool
    def __init__(self, name: _Optional[str] = ..., depth: _Optional[int] = ..., pending: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class GetQueueStatsRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class GetQueueStatsResponse(_message.Message):
    __slots__ = ("queue", "bands", "depth", "pending", "scheduled", "oldest_task_age_ms", "paused", "dead_letter_depth", "consumers", "succeeded", "failed", "retried", "dead_lettered", "cancelled", "succeeded_per_s", "failed_per_s", "throughput_window_ms", "waiting_types", "waiting_complete", "stuck_task_types")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    BANDS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_TASK_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RETRIED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_PER_S_FIELD_NUMBER: _ClassVar[int]
    FAILED_PER_S_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    WAITING_TYPES_FIELD_NUMBER: _ClassVar[int]
    WAITING_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    STUCK_TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    bands: _containers.RepeatedCompositeFieldContainer[BandStats]
    depth: int
    pending: int
    scheduled: int
    oldest_task_age_ms: int
    paused: bool
    dead_letter_depth: int
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStats]
    succeeded: int
    failed: int
    retried: int
    dead_lettered: int
    cancelled: int
    succeeded_per_s: float
    failed_per_s: float
    throughput_window_ms: int
    waiting_types: _containers.RepeatedCompositeFieldContainer[TaskTypeWaiting]
    waiting_complete: bool
    stuck_task_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, queue: _Optional[str] = ..., bands: _Optional[_Iterable[_Union[BandStats, _Mapping]]] = ..., depth: _Optional[int] = ..., pending: _Optional[int] = ..., scheduled: _Optional[int] = ..., oldest_task_age_ms: _Optional[int] = ..., paused: _Optional[bool] = ..., dead_letter_depth: _Optional[int] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStats, _Mapping]]] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., retried: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., cancelled: _Optional[int] = ..., succeeded_per_s: _Optional[float] = ..., failed_per_s: _Optional[float] = ..., throughput_window_ms: _Optional[int] = ..., waiting_types: _Optional[_Iterable[_Union[TaskTypeWaiting, _Mapping]]] = ..., waiting_complete: _Optional[bool] = ..., stuck_task_types: _Optional[_Iterable[str]] = ...) -> None: ...

class BandStats(_message.Message):
    __slots__ = ("band", "depth", "pending")
    BAND_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    band: int
    depth: int
    pending: int
    def __init__(self, band: _Optional[int] = ..., depth: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class ConsumerStats(_message.Message):
    __slots__ = ("name", "pending", "idle_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    pending: int
    idle_ms: int
    def __init__(self, name: _Optional[str] = ..., pending: _Optional[int] = ..., idle_ms: _Optional[int] = ...) -> None: ...

class PauseQueueRequest(_message.Message):
    __slots__ = ("queue", "reason", "create")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    reason: str
    create: bool
    def __init__(self, queue: _Optional[str] = ..., reason: _Optional[str] = ..., create: _Optional[bool] = ...) -> None: ...

class PauseQueueResponse(_message.Message):
    __slots__ = ("changed", "request_id")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    request_id: str
    def __init__(self, changed: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResumeQueueRequest(_message.Message):
    __slots__ = ("queue", "reason")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    reason: str
    def __init__(self, queue: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ResumeQueueResponse(_message.Message):
    __slots__ = ("changed", "request_id")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    request_id: str
    def __init__(self, changed: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("queue", "dry_run", "discard_dead_letters", "reason")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    DISCARD_DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    dry_run: bool
    discard_dead_letters: bool
    reason: str
    def __init__(self, queue: _Optional[str] = ..., dry_run: _Optional[bool] = ..., discard_dead_letters: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ("deleted", "dry_run", "keys", "dead_letters_discarded", "request_id")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    dry_run: bool
    keys: _containers.RepeatedScalarFieldContainer[str]
    dead_letters_discarded: int
    request_id: str
    def __init__(self, deleted: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., keys: _Optional[_Iterable[str]] = ..., dead_letters_discarded: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "queue")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    queue: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., queue: _Optional[str] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("entry_id", "task_id", "queue", "task_type", "payload", "attempts_made", "last_error", "last_error_class", "failed_at_ms", "worker_id", "priority")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_MADE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    task_id: str
    queue: str
    task_type: str
    payload: bytes
    attempts_made: int
    last_error: str
    last_error_class: str
    failed_at_ms: int
    worker_id: str
    priority: int
    def __init__(self, entry_id: _Optional[str] = ..., task_id: _Optional[str] = ..., queue: _Optional[str] = ..., task_type: _Optional[str] = ..., payload: _Optional[bytes] = ..., attempts_made: _Optional[int] = ..., last_error: _Optional[str] = ..., last_error_class: _Optional[str] = ..., failed_at_ms: _Optional[int] = ..., worker_id: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class RequeueDeadLetterRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class RequeueDeadLetterResponse(_message.Message):
    __slots__ = ("task_id", "request_id")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    request_id: str
    def __init__(self, task_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class DiscardDeadLetterRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class DiscardDeadLetterResponse(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ("purged", "request_id")
    PURGED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    purged: int
    request_id: str
    def __init__(self, purged: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class RedriveDeadLettersRequest(_message.Message):
    __slots__ = ("queue", "task_type", "error_class", "min_age_ms", "max_age_ms", "dry_run", "max_per_second", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    MIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    task_type: str
    error_class: str
    min_age_ms: int
    max_age_ms: int
    dry_run: bool
    max_per_second: int
    limit: int
    def __init__(self, queue: _Optional[str] = ..., task_type: _Optional[str] = ..., error_class: _Optional[str] = ..., min_age_ms: _Optional[int] = ..., max_age_ms: _Optional[int] = ..., dry_run: _Optional[bool] = ..., max_per_second: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class RedriveDeadLettersResponse(_message.Message):
    __slots__ = ("matched", "requeued", "task_ids", "request_id")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    matched: int
    requeued: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    def __init__(self, matched: _Optional[int] = ..., requeued: _Optional[int] = ..., task_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "hostname", "started_at_ms", "last_heartbeat_at_ms", "heartbeat_age_ms", "active_tasks", "concurrency", "tasks_processed", "tasks_failed", "tasks_retried", "status", "alive", "leasing", "labels", "queues", "task_types")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    TASKS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    TASKS_RETRIED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LEASING_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    hostname: str
    started_at_ms: int
    last_heartbeat_at_ms: int
    heartbeat_age_ms: int
    active_tasks: int
    concurrency: int
    tasks_processed: int
    tasks_failed: int
    tasks_retried: int
    status: str
    alive: bool
    leasing: bool
    labels: _containers.ScalarMap[str, str]
    queues: _containers.RepeatedScalarFieldContainer[str]
    task_types: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., hostname: _Optional[str] = ..., started_at_ms: _Optional[int] = ..., last_heartbeat_at_ms: _Optional[int] = ..., heartbeat_age_ms: _Optional[int] = ..., active_tasks: _Optional[int] = ..., concurrency: _Optional[int] = ..., tasks_processed: _Optional[int] = ..., tasks_failed: _Optional[int] = ..., tasks_retried: _Optional[int] = ..., status: _Optional[str] = ..., alive: _Optional[bool] = ..., leasing: _Optional[bool] = ..., labels: _Optional[_Mapping[str, str]] = ..., queues: _Optional[_Iterable[str]] = ..., task_types: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRecentTasksRequest(_message.Message):
    __slots__ = ("limit", "queue", "status")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    limit: int
    queue: str
    status: TaskStatus
    def __init__(self, limit: _Optional[int] = ..., queue: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ...) -> None: ...

class ListRecentTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("entry_id", "actor", "action", "task_id", "ts_ms", "request_id", "detail")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TS_MS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    actor: str
    action: str
    task_id: str
    ts_ms: int
    request_id: str
    detail: str
    def __init__(self, entry_id: _Optional[str] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., task_id: _Optional[str] = ..., ts_ms: _Optional[int] = ..., request_id: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("queues", "types")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedScalarFieldContainer[str]
    types: _containers.RepeatedScalarFieldContainer[EventType]
    def __init__(self, queues: _Optional[_Iterable[str]] = ..., types: _Optional[_Iterable[_Union[EventType, str]]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("event_id", "ts", "type", "task_id", "queue", "task_type", "attempt", "worker_id", "metadata", "dropped")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    ts: str
    type: EventType
    task_id: str
    queue: str
    task_type: str
    attempt: int
    worker_id: str
    metadata: _containers.ScalarMap[str, str]
    dropped: int
    def __init__(self, event_id: _Optional[str] = ..., ts: _Optional[str] = ..., type: _Optional[_Union[EventType, str]] = ..., task_id: _Optional[str] = ..., queue: _Optional[str] = ..., task_type: _Optional[str] = ..., attempt: _Optional[int] = ..., worker_id: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ..., dropped: _Optional[int] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "cron", "timezone", "interval_ms", "task", "catch_up", "catch_up_max_fires", "catch_up_max_age_ms", "paused")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TIMEZONE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_MAX_FIRES_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    timezone: str
    interval_ms: int
    task: EnqueueRequest
    catch_up: ScheduleCatchUp
    catch_up_max_fires: int
    catch_up_max_age_ms: int
    paused: bool
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., timezone: _Optional[str] = ..., interval_ms: _Optional[int] = ..., task: _Optional[_Union[EnqueueRequest, _Mapping]] = ..., catch_up: _Optional[_Union[ScheduleCatchUp, str]] = ..., catch_up_max_fires: _Optional[int] = ..., catch_up_max_age_ms: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class ScheduleInfo(_message.Message):
    __slots__ = ("schedule", "next_fire_ms", "last_fire_ms", "last_task_id", "fires_total", "created_at_ms")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    FIRES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    next_fire_ms: int
    last_fire_ms: int
    last_task_id: str
    fires_total: int
    created_at_ms: int
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., next_fire_ms: _Optional[int] = ..., last_fire_ms: _Optional[int] = ..., last_task_id: _Optional[str] = ..., fires_total: _Optional[int] = ..., created_at_ms: _Optional[int] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "replace")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    replace: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., replace: _Optional[bool] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule", "created")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleInfo
    created: bool
    def __init__(self, schedule: _Optional[_Union[ScheduleInfo, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[ScheduleInfo]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[ScheduleInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleInfo
    def __init__(self, schedule: _Optional[_Union[ScheduleInfo, _Mapping]] = ...) -> None: ...

class PauseScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleInfo
    def __init__(self, schedule: _Optional[_Union[ScheduleInfo, _Mapping]] = ...) -> None: ...

class ResumeScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: ScheduleInfo
    def __init__(self, schedule: _Optional[_Union[ScheduleInfo, _Mapping]] = ...) -> None: ...

class TriggerScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class TriggerScheduleResponse(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class RateLimit(_message.Message):
    __slots__ = ("queue", "task_type", "limit", "period_ms", "burst", "tokens")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_MS_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    task_type: str
    limit: int
    period_ms: int
    burst: int
    tokens: float
    def __init__(self, queue: _Optional[str] = ..., task_type: _Optional[str] = ..., limit: _Optional[int] = ..., period_ms: _Optional[int] = ..., burst: _Optional[int] = ..., tokens: _Optional[float] = ...) -> None: ...

class SetRateLimitRequest(_message.Message):
    __slots__ = ("rate_limit",)
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    rate_limit: RateLimit
    def __init__(self, rate_limit: _Optional[_Union[RateLimit, _Mapping]] = ...) -> None: ...

class SetRateLimitResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class DeleteRateLimitRequest(_message.Message):
    __slots__ = ("queue", "task_type")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    task_type: str
    def __init__(self, queue: _Optional[str] = ..., task_type: _Optional[str] = ...) -> None: ...

class DeleteRateLimitResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListRateLimitsRequest(_message.Message):
    __slots__ = ("queue", "page_size", "page_token")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    page_size: int
    page_token: str
    def __init__(self, queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRateLimitsResponse(_message.Message):
    __slots__ = ("rate_limits", "next_page_token")
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    rate_limits: _containers.RepeatedCompositeFieldContainer[RateLimit]
    next_page_token: str
    def __init__(self, rate_limits: _Optional[_Iterable[_Union[RateLimit, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SetConcurrencyLimitRequest(_message.Message):
    __slots__ = ("queue", "max_active_per_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_active_per_key: int
    def __init__(self, queue: _Optional[str] = ..., max_active_per_key: _Optional[int] = ...) -> None: ...

class SetConcurrencyLimitResponse(_message.Message):
    __slots__ = ("created",)
    CREATED_FIELD_NUMBER: _ClassVar[int]
    created: bool
    def __init__(self, created: _Optional[bool] = ...) -> None: ...

class GetConcurrencyRequest(_message.Message):
    __slots__ = ("queue", "max_keys")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_KEYS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_keys: int
    def __init__(self, queue: _Optional[str] = ..., max_keys: _Optional[int] = ...) -> None: ...

class ConcurrencyKeyStats(_message.Message):
    __slots__ = ("key", "active", "waiting")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    key: str
    active: int
    waiting: int
    def __init__(self, key: _Optional[str] = ..., active: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class GetConcurrencyResponse(_message.Message):
    __slots__ = ("queue", "max_active_per_key", "keys", "key_count", "active", "waiting")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    KEY_COUNT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_active_per_key: int
    keys: _containers.RepeatedCompositeFieldContainer[ConcurrencyKeyStats]
    key_count: int
    active: int
    waiting: int
    def __init__(self, queue: _Optional[str] = ..., max_active_per_key: _Optional[int] = ..., keys: _Optional[_Iterable[_Union[ConcurrencyKeyStats, _Mapping]]] = ..., key_count: _Optional[int] = ..., active: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class DeleteConcurrencyLimitRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class DeleteConcurrencyLimitResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ListConcurrencyLimitsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConcurrencyLimit(_message.Message):
    __slots__ = ("queue", "max_active_per_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_PER_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_active_per_key: int
    def __init__(self, queue: _Optional[str] = ..., max_active_per_key: _Optional[int] = ...) -> None: ...

class ListConcurrencyLimitsResponse(_message.Message):
    __slots__ = ("limits",)
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    limits: _containers.RepeatedCompositeFieldContainer[ConcurrencyLimit]
    def __init__(self, limits: _Optional[_Iterable[_Union[ConcurrencyLimit, _Mapping]]] = ...) -> None: ...

class TaskProgress(_message.Message):
    __slots__ = ("lease_id", "percent", "message")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    percent: float
    message: str
    def __init__(self, lease_id: _Optional[str] = ..., percent: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class TaskTypeWaiting(_message.Message):
    __slots__ = ("task_type", "waiting", "oldest_age_ms", "taken", "required_labels")
    class RequiredLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    TAKEN_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_LABELS_FIELD_NUMBER: _ClassVar[int]
    task_type: str
    waiting: int
    oldest_age_ms: int
    taken: bool
    required_labels: _containers.ScalarMap[str, str]
    def __init__(self, task_type: _Optional[str] = ..., waiting: _Optional[int] = ..., oldest_age_ms: _Optional[int] = ..., taken: _Optional[bool] = ..., required_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TaskFilter(_message.Message):
    __slots__ = ("queue", "task_type", "statuses", "metadata", "min_age_ms", "max_age_ms", "created_after_ms", "created_before_ms")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    task_type: str
    statuses: _containers.RepeatedScalarFieldContainer[TaskStatus]
    metadata: _containers.ScalarMap[str, str]
    min_age_ms: int
    max_age_ms: int
    created_after_ms: int
    created_before_ms: int
    def __init__(self, queue: _Optional[str] = ..., task_type: _Optional[str] = ..., statuses: _Optional[_Iterable[_Union[TaskStatus, str]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., min_age_ms: _Optional[int] = ..., max_age_ms: _Optional[int] = ..., created_after_ms: _Optional[int] = ..., created_before_ms: _Optional[int] = ...) -> None: ...

class CancelTasksRequest(_message.Message):
    __slots__ = ("filter", "dry_run", "limit", "reason")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    filter: TaskFilter
    dry_run: bool
    limit: int
    reason: str
    def __init__(self, filter: _Optional[_Union[TaskFilter, _Mapping]] = ..., dry_run: _Optional[bool] = ..., limit: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTasksResponse(_message.Message):
    __slots__ = ("matched", "cancelled", "task_ids", "request_id", "cancel_requested")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    matched: int
    cancelled: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    request_id: str
    cancel_requested: int
    def __init__(self, matched: _Optional[int] = ..., cancelled: _Optional[int] = ..., task_ids: _Optional[_Iterable[str]] = ..., request_id: _Optional[str] = ..., cancel_requested: _Optional[int] = ...) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("queue", "dry_run", "reason")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    queue: str
    dry_run: bool
    reason: str
    def __init__(self, queue: _Optional[str] = ..., dry_run: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("matched", "cancelled", "request_id")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    matched: int
    cancelled: int
    request_id: str
    def __init__(self, matched: _Optional[int] = ..., cancelled: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class SearchTasksRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token")
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: TaskFilter
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[TaskFilter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class SearchTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token", "examined")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXAMINED_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_page_token: str
    examined: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., examined: _Optional[int] = ...) -> None: ...
