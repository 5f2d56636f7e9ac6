package dtq

import (
	"context"
	"io"
	"math/rand"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"dtq/clients/go/dtqpb"
)

// Reconnect backoff of the Lease stream: the n-th retry waits a random time in
// [d/2, d], d = min(backoffCap, backoffBase x 2^n); reset by a SessionInfo.
const (
	backoffBase = 200 * time.Millisecond
	backoffCap  = 5 * time.Second
	callTimeout = 10 * time.Second // deadline of Heartbeat, Ack and Fail
	hbTick      = 20 * time.Millisecond
)

// fatalCode reports the codes after which retrying cannot help.
func fatalCode(c codes.Code) bool {
	return c == codes.Unauthenticated || c == codes.PermissionDenied ||
		c == codes.InvalidArgument
}

// backoffDelay is the n-th (0-based) jittered retry delay.
func backoffDelay(n int) time.Duration {
	d := backoffCap
	if n < 10 {
		if e := backoffBase << uint(n); e < d {
			d = e
		}
	}
	return d/2 + time.Duration(rand.Int63n(int64(d/2)+1))
}

func (w *Worker) leaseRequest() *dtqpb.LeaseRequest {
	types := make([]string, 0, len(w.handlers))
	for t := range w.handlers {
		types = append(types, t)
	}
	return &dtqpb.LeaseRequest{WorkerId: w.cfg.WorkerID, Queues: w.cfg.Queues,
		TaskTypes: types, MaxInFlight: uint32(w.cfg.MaxInFlight),
		Concurrency: uint32(w.cfg.Concurrency), MaxBatch: uint32(w.cfg.MaxBatch),
		Hostname: w.host, Labels: w.cfg.Labels, Sdk: SDK, AcceptCancelNotices: true}
}

// leaseLoop keeps a Lease stream open until ctx ends or the drain's stream ends:
// after the draining heartbeat the gateway ends the stream with OK once every
// lease sent has been written, and the worker must not reconnect.
func (w *Worker) leaseLoop(ctx context.Context) {
	for retry := 0; ctx.Err() == nil; retry++ {
		err := w.session(ctx, &retry)
		if w.draining() {
			return
		}
		if s, _ := status.FromError(err); err != nil && fatalCode(s.Code()) {
			w.refuse(err)
			return
		}
		w.log.Printf("lease stream ended (%v); reconnecting", err)
		select {
		case <-ctx.Done():
			return
		case <-w.drain:
			return
		case <-time.After(backoffDelay(retry)):
		}
	}
}

// session reads one Lease stream to its end; nil when it ended with OK.
func (w *Worker) session(ctx context.Context, retry *int) error {
	stream, err := w.stub.Lease(ctx, w.leaseRequest(), grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	defer atomic.StoreInt32(&w.open, 0)
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch kind := msg.Kind.(type) {
		case *dtqpb.LeaseResponse_Session:
			*retry = -1 // the loop's increment makes it 0
			atomic.StoreInt32(&w.open, 1)
			if ms := kind.Session.HeartbeatIntervalMs; ms > 0 {
				atomic.StoreInt64(&w.hbMs, int64(ms))
			}
		case *dtqpb.LeaseResponse_Task:
			w.onTask(kind.Task)
		case *dtqpb.LeaseResponse_Batch:
			addOne(&w.batches)
			for _, t := range kind.Batch.Tasks {
				w.onTask(t)
			}
		case *dtqpb.LeaseResponse_Cancelled:
			w.onCancelNotice(kind.Cancelled.LeaseIds)
		}
	}
}

// heartbeatLoop beats every heartbeat interval (measured from the end of the
// previous beat), even with no lease held, until ctx ends. The interval is
// re-read every tick: the first SessionInfo usually shortens the default.
func (w *Worker) heartbeatLoop(ctx context.Context) {
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(hbTick):
		}
		interval := time.Duration(atomic.LoadInt64(&w.hbMs)) * time.Millisecond
		if time.Since(last) < interval {
			continue
		}
		w.beat(ctx)
		last = time.Now()
	}
}

// beat sends one Heartbeat listing every held lease (draining=true once the drain
// began) and stops the leases it reports lost or cancelled.
func (w *Worker) beat(ctx context.Context) {
	w.mu.Lock()
	ids := make([]string, 0, len(w.held))
	byID := make(map[string]*lease, len(w.held))
	active := 0
	for id, l := range w.held {
		ids = append(ids, id)
		byID[id] = l
		if l.phase == phaseRunning {
			active++
		}
	}
	w.mu.Unlock()
	c := w.Counters()
	req := &dtqpb.HeartbeatRequest{WorkerId: w.cfg.WorkerID, LeaseIds: ids,
		ActiveTasks: uint32(active), Concurrency: uint32(w.cfg.Concurrency),
		Hostname: w.host, Draining: w.draining(),
		Counters: &dtqpb.WorkerCounters{TasksProcessed: c.Processed, TasksFailed: c.Failed}}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := w.stub.Heartbeat(cctx, req)
	if err != nil {
		if s, _ := status.FromError(err); fatalCode(s.Code()) {
			w.refuse(err)
		}
		w.log.Printf("heartbeat failed: %v", err) // retried at the next tick
		return
	}
	if ms := resp.HeartbeatIntervalMs; ms > 0 {
		atomic.StoreInt64(&w.hbMs, int64(ms))
	}
	w.stopLeases(resp.LostLeaseIds, reasonLost, byID)
	w.stopLeases(resp.CancelledLeaseIds, reasonCancelled, byID)
}

// onCancelNotice stops the leases a LeaseCancelled notice of the stream names, as a
// heartbeat answer's cancelled_lease_ids (ids not held are ignored; each cancel is
// reported once).
func (w *Worker) onCancelNotice(ids []string) {
	byID := make(map[string]*lease, len(ids))
	w.mu.Lock()
	for _, id := range ids {
		if l := w.held[id]; l != nil {
			byID[id] = l
		}
	}
	w.mu.Unlock()
	w.stopLeases(ids, reasonCancelled, byID)
}

// stopLeases stops the named leases still held (ids no longer held are ignored;
// a cancelled lease is reported once: halt keeps the first reason).
func (w *Worker) stopLeases(ids []string, reason string, byID map[string]*lease) {
	for _, id := range ids {
		l := byID[id]
		if l == nil {
			continue
		}
		w.mu.Lock()
		phase := l.phase
		w.mu.Unlock()
		switch {
		case phase == phaseBuffered:
			w.stopBuffered(l, reason)
		case phase == phaseRunning:
			l.halt(reason)
		case reason == reasonLost:
			l.halt(reason) // its report is still resent and counted by its answer
		}
	}
}
