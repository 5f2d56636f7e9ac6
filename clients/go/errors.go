package dtq

import (
	"fmt"
	"time"

	"dtq/clients/go/dtqpb"
)

// PermanentError fails a task without retry (FailItem.retryable = false): it is
// dead-lettered at once, whatever attempts are left. Return it from a handler
// for errors no retry can fix (bad input).
type PermanentError struct {
	// Class is the error class stored with the attempt ("" = "PermanentError").
	Class   string
	Message string
}

func (e *PermanentError) Error() string { return e.Message }

// RetryAfterError fails a task retryably and sets the delay before the next
// attempt (FailItem.retry_after_ms, 0..86400000 ms), replacing the backoff.
type RetryAfterError struct {
	Message string
	After   time.Duration
}

func (e *RetryAfterError) Error() string { return e.Message }

// TaskFailedError is returned by Client.Wait for a task that ended without
// success (DEAD_LETTERED, CANCELLED or EXPIRED).
type TaskFailedError struct {
	// Task is the task record as GetTask answered it.
	Task *dtqpb.Task
}

func (e *TaskFailedError) Error() string {
	t := e.Task
	return fmt.Sprintf("dtq: task %s ended %s: %s: %s", t.TaskId, t.Status, t.LastErrorClass,
		t.LastError)
}
