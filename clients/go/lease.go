package dtq

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"dtq/clients/go/dtqpb"
)

// Why a worker stops a task before its handler returns.
const (
	reasonNone      = ""
	reasonTimeout   = "timeout"   // timeout_ms passed: Fail "Timeout", retryable
	reasonCancelled = "cancelled" // CancelTask: Fail FAIL_MODE_CANCELLED
	reasonLost      = "lost"      // the lease is no longer ours: report nothing new
	reasonDrain     = "drain"     // shutdown: Fail FAIL_MODE_RELEASE
)

// Phases of a held lease.
const (
	phaseBuffered  = iota // waits for a free slot
	phaseRunning          // its handler runs
	phaseReporting        // its Ack/Fail is being sent
)

// lease is one held lease, from its arrival until the gateway answered its report.
type lease struct {
	task   *dtqpb.LeasedTask
	phase  int // guarded by Worker.mu
	reason string
	once   sync.Once
	stop   chan struct{} // closed when the worker stops the task
}

// halt stops the task for reason; the first reason wins.
func (l *lease) halt(reason string) {
	l.once.Do(func() { l.reason = reason; close(l.stop) })
}

// onTask holds a newly delivered lease and queues it for a slot (or releases it
// at once when the drain has begun: it arrived in transit and never runs).
func (w *Worker) onTask(t *dtqpb.LeasedTask) {
	l := &lease{task: t, stop: make(chan struct{})}
	w.mu.Lock()
	w.held[t.LeaseId] = l
	w.mu.Unlock()
	if w.draining() {
		w.stopBuffered(l, reasonDrain)
		return
	}
	w.ready <- l
}

// take moves a buffered lease to phase; false when it already left the buffer.
func (w *Worker) take(l *lease, phase int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.phase != phaseBuffered {
		return false
	}
	l.phase = phase
	return true
}

// stopBuffered reports a lease that never ran (cancelled, released) or drops a lost one.
func (w *Worker) stopBuffered(l *lease, reason string) {
	if w.take(l, phaseReporting) {
		l.halt(reason)
		w.reportStopped(l)
	}
}

func (w *Worker) releaseBuffered() {
	for _, l := range w.snapshot() {
		w.stopBuffered(l, reasonDrain)
	}
}

// stopAll stops every running handler for reason (the drain's grace ended).
func (w *Worker) stopAll(reason string) {
	for _, l := range w.snapshot() {
		w.mu.Lock()
		running := l.phase == phaseRunning
		w.mu.Unlock()
		if running {
			l.halt(reason)
		}
	}
}

func (w *Worker) snapshot() []*lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*lease, 0, len(w.held))
	for _, l := range w.held {
		out = append(out, l)
	}
	return out
}

// slotLoop is one handler slot: it runs buffered leases one at a time.
func (w *Worker) slotLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-w.ready:
			if w.draining() || !w.take(l, phaseRunning) {
				continue // the drain releases it, or it was stopped while buffered
			}
			w.runLease(l)
		}
	}
}

type outcome struct {
	result []byte
	err    error
}

// runLease runs the handler under the task's time limit. When the worker stops
// the task it reports at once, and the slot stays taken until the handler returns.
func (w *Worker) runLease(l *lease) {
	hctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	limit := time.Duration(l.task.TimeoutMs) * time.Millisecond
	if limit <= 0 {
		limit = 24 * time.Hour
	}
	timer := time.AfterFunc(limit, func() { l.halt(reasonTimeout) })
	defer timer.Stop()
	done := make(chan outcome, 1)
	go func() { done <- w.call(hctx, l.task) }()
	select {
	case out := <-done:
		timer.Stop()
		w.mu.Lock()
		l.phase = phaseReporting
		w.mu.Unlock()
		w.reportOutcome(l, out)
	case <-l.stop:
		cancel()
		w.mu.Lock()
		l.phase = phaseReporting
		w.mu.Unlock()
		w.reportStopped(l)
		<-done // the slot is free only when the handler really returned
	}
}

// call runs the handler, turning a panic into a retryable failure.
func (w *Worker) call(ctx context.Context, t *dtqpb.LeasedTask) (out outcome) {
	defer func() {
		if p := recover(); p != nil {
			out = outcome{err: &panicError{fmt.Sprintf("handler panic: %v", p)}}
		}
	}()
	h := w.handlers[t.TaskType]
	if h == nil {
		return outcome{err: &PermanentError{Class: "UnknownTaskType",
			Message: "no handler for task type " + t.TaskType}}
	}
	res, err := h(ctx, t)
	return outcome{res, err}
}

// reportOutcome sends the handler's answer: Ack, or Fail by the error's kind.
func (w *Worker) reportOutcome(l *lease, out outcome) {
	if out.err == nil {
		w.rep.ack(l, out.result)
		return
	}
	item := &dtqpb.FailItem{LeaseId: l.task.LeaseId, ErrorMessage: out.err.Error(),
		ErrorClass: errorClass(out.err), Mode: dtqpb.FailMode_FAIL_MODE_FAILURE}
	var perm *PermanentError
	var later *RetryAfterError
	switch {
	case errors.As(out.err, &perm):
		item.XRetryable = &dtqpb.FailItem_Retryable{Retryable: false}
		if perm.Class != "" {
			item.ErrorClass = perm.Class
		}
	case errors.As(out.err, &later):
		item.RetryAfterMs = uint64(later.After / time.Millisecond)
	}
	w.rep.fail(l, item)
}

// reportStopped reports a task the worker stopped, by the reason it stopped it.
func (w *Worker) reportStopped(l *lease) {
	id := l.task.LeaseId
	switch l.reason {
	case reasonTimeout:
		w.rep.fail(l, &dtqpb.FailItem{LeaseId: id, ErrorClass: "Timeout",
			ErrorMessage: "handler exceeded timeout_ms", Mode: dtqpb.FailMode_FAIL_MODE_FAILURE})
	case reasonCancelled:
		w.rep.fail(l, &dtqpb.FailItem{LeaseId: id, ErrorClass: "Cancelled",
			ErrorMessage: "cancelled", Mode: dtqpb.FailMode_FAIL_MODE_CANCELLED})
	case reasonDrain:
		w.rep.fail(l, &dtqpb.FailItem{LeaseId: id, ErrorClass: "Shutdown",
			ErrorMessage: "worker draining", Mode: dtqpb.FailMode_FAIL_MODE_RELEASE})
	default: // lost: another worker may run it; nothing to report
		w.forget(l, &w.stale)
	}
}

// forget drops a lease that is answered (or lost) and counts it.
func (w *Worker) forget(l *lease, counter *uint64) {
	w.mu.Lock()
	delete(w.held, l.task.LeaseId)
	w.mu.Unlock()
	if counter != nil {
		addOne(counter)
	}
}

// panicError is a handler's panic, failed retryably with error class "Panic".
type panicError struct{ msg string }

func (e *panicError) Error() string { return e.msg }

// errorClass is the error's type name ("Error" for unnamed or unexported types,
// such as those of errors.New and fmt.Errorf).
func errorClass(err error) string {
	if _, ok := err.(*panicError); ok {
		return "Panic"
	}
	t := reflect.TypeOf(err)
	for t.Kind() == reflect.Ptr {
		t = t.Elem()
	}
	name := t.Name()
	if name == "" || name[0] < 'A' || name[0] > 'Z' {
		return "Error"
	}
	return name
}
