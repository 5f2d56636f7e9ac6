package dtq

import (
	"context"
	"errors"
	"io/ioutil"
	"log"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"dtq/clients/go/dtqpb"
)

// fakeBroker is an in-process gateway: its Lease stream sends SessionInfo and
// then the given LeaseResponses, and ends with OK after a draining heartbeat.
type fakeBroker struct {
	dtqpb.UnimplementedBrokerServer
	send      []*dtqpb.LeaseResponse
	cancelled map[string]bool // lease ids the heartbeats report cancelled
	stale     map[string]bool // lease ids whose Ack is answered STALE_LEASE
	failFirst bool            // answer the first Ack call UNAVAILABLE
	ackCalls  int

	mu       sync.Mutex
	request  *dtqpb.LeaseRequest
	acks     map[string][]byte
	fails    map[string]*dtqpb.FailItem
	drained  chan struct{}
	drainOne sync.Once
	changed  chan struct{}
}

func newFakeBroker(send ...*dtqpb.LeaseResponse) *fakeBroker {
	return &fakeBroker{send: send, cancelled: map[string]bool{}, stale: map[string]bool{}, acks: map[string][]byte{},
		fails: map[string]*dtqpb.FailItem{}, drained: make(chan struct{}),
		changed: make(chan struct{}, 1000)}
}

func (f *fakeBroker) Lease(req *dtqpb.LeaseRequest, stream dtqpb.Broker_LeaseServer) error {
	f.mu.Lock()
	f.request = req
	f.mu.Unlock()
	info := &dtqpb.SessionInfo{HeartbeatIntervalMs: 50, VisibilityTimeoutMs: 2000,
		MaxInFlight: req.MaxInFlight, MaxBatch: req.MaxBatch}
	if err := stream.Send(&dtqpb.LeaseResponse{Kind: &dtqpb.LeaseResponse_Session{Session: info}}); err != nil {
		return err
	}
	for _, m := range f.send {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	f.send = nil
	select {
	case <-f.drained:
		return nil
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

func (f *fakeBroker) Heartbeat(_ context.Context, req *dtqpb.HeartbeatRequest) (*dtqpb.HeartbeatResponse, error) {
	if req.Draining {
		f.drainOne.Do(func() { close(f.drained) })
	}
	resp := &dtqpb.HeartbeatResponse{}
	f.mu.Lock()
	for _, id := range req.LeaseIds {
		if f.cancelled[id] {
			resp.CancelledLeaseIds = append(resp.CancelledLeaseIds, id)
		}
	}
	f.mu.Unlock()
	return resp, nil
}

func (f *fakeBroker) Ack(_ context.Context, req *dtqpb.AckRequest) (*dtqpb.AckResponse, error) {
	resp := &dtqpb.AckResponse{}
	f.mu.Lock()
	f.ackCalls++
	if f.failFirst && f.ackCalls == 1 {
		f.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "try again")
	}
	for _, it := range req.Items {
		result := &dtqpb.LeaseResult{LeaseId: it.LeaseId}
		if f.stale[it.LeaseId] {
			result.Error = &dtqpb.ItemError{Code: int32(codes.FailedPrecondition),
				Reason: "STALE_LEASE"}
		} else {
			f.acks[it.LeaseId] = it.Result
		}
		resp.Results = append(resp.Results, result)
	}
	f.mu.Unlock()
	f.changed <- struct{}{}
	return resp, nil
}

func (f *fakeBroker) Fail(_ context.Context, req *dtqpb.FailRequest) (*dtqpb.FailResponse, error) {
	resp := &dtqpb.FailResponse{}
	f.mu.Lock()
	for _, it := range req.Items {
		f.fails[it.LeaseId] = it
		resp.Results = append(resp.Results, &dtqpb.LeaseResult{LeaseId: it.LeaseId})
	}
	f.mu.Unlock()
	f.changed <- struct{}{}
	return resp, nil
}

// reported waits (up to 10 s) until n items were acked or failed.
func (f *fakeBroker) reported(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		got := len(f.acks) + len(f.fails)
		f.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-f.changed:
		case <-deadline:
			t.Fatalf("%d reports after 10 s, want %d", got, n)
		}
	}
}

func serve(t *testing.T, f *fakeBroker) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	dtqpb.RegisterBrokerServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func task(id, taskType string) *dtqpb.LeasedTask {
	return &dtqpb.LeasedTask{LeaseId: id, TaskId: "t-" + id, Queue: "q", TaskType: taskType,
		Payload: []byte(id), Attempt: 1, MaxAttempts: 3, TimeoutMs: 60000}
}

func batch(tasks ...*dtqpb.LeasedTask) *dtqpb.LeaseResponse {
	return &dtqpb.LeaseResponse{Kind: &dtqpb.LeaseResponse_Batch{
		Batch: &dtqpb.LeasedTaskBatch{Tasks: tasks}}}
}

// start runs a worker against f; the returned stop cancels Run and waits for it.
func start(t *testing.T, f *fakeBroker, cfg WorkerConfig, handlers map[string]Handler) (*Worker, func() error) {
	cfg.Conn.Target = serve(t, f)
	cfg.Queues = []string{"q"}
	cfg.Logger = log.New(ioutil.Discard, "", 0)
	w := NewWorker(cfg)
	for name, h := range handlers {
		w.Handle(name, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return w, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return 20 s after its context ended")
			return nil
		}
	}
}

func echoHandler(_ context.Context, task *dtqpb.LeasedTask) ([]byte, error) {
	return task.Payload, nil
}

func TestWorkerAsksForBatchesAndRunsEveryTaskOfABatch(t *testing.T) {
	f := newFakeBroker(batch(task("a", "echo"), task("b", "echo"), task("c", "echo")))
	w, stop := start(t, f, WorkerConfig{Concurrency: 2, MaxBatch: 8},
		map[string]Handler{"echo": echoHandler})
	f.reported(t, 3)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := w.Counters().Batches; n != 1 {
		t.Errorf("Counters().Batches = %d, want 1", n)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.request.MaxBatch != 8 {
		t.Errorf("LeaseRequest.max_batch = %d, want 8", f.request.MaxBatch)
	}
	for _, id := range []string{"a", "b", "c"} {
		if string(f.acks[id]) != id {
			t.Errorf("lease %s acked with %q, want its payload", id, f.acks[id])
		}
	}
}

func TestDrainFinishesTheRunningTaskAndReleasesTheBufferedOnes(t *testing.T) {
	started := make(chan struct{}, 3)
	slow := func(ctx context.Context, task *dtqpb.LeasedTask) ([]byte, error) {
		started <- struct{}{}
		time.Sleep(300 * time.Millisecond) // finishes within the grace period
		return []byte("done"), nil
	}
	f := newFakeBroker(batch(task("a", "slow"), task("b", "slow"), task("c", "slow")))
	_, stop := start(t, f, WorkerConfig{Concurrency: 1, MaxInFlight: 3, MaxBatch: 3,
		DrainGrace: 5 * time.Second}, map[string]Handler{"slow": slow})
	<-started
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.acks) != 1 || len(f.fails) != 2 {
		t.Fatalf("acks %v fails %v: want the running task acked, two released", f.acks, f.fails)
	}
	for id, item := range f.fails {
		if item.Mode != dtqpb.FailMode_FAIL_MODE_RELEASE {
			t.Errorf("lease %s failed with mode %v, want FAIL_MODE_RELEASE", id, item.Mode)
		}
	}
	select {
	case <-f.drained:
	default:
		t.Error("no heartbeat with draining=true")
	}
}

// A running task's handler context ends within one heartbeat (50 ms here) of the
// gateway's listing it in cancelled_lease_ids, as in the Python worker: the Go worker
// adds no wait of its own (a 10 s bound would hide a missed heartbeat, 2 s does not).
func TestCancelledLeaseStopsItsHandlerAndIsReportedCancelled(t *testing.T) {
	f := newFakeBroker(&dtqpb.LeaseResponse{Kind: &dtqpb.LeaseResponse_Task{Task: task("a", "wait")}})
	started, stopped := make(chan struct{}), make(chan struct{})
	wait := func(ctx context.Context, _ *dtqpb.LeasedTask) ([]byte, error) {
		close(started)
		<-ctx.Done()
		close(stopped)
		return nil, ctx.Err()
	}
	_, stop := start(t, f, WorkerConfig{Concurrency: 1}, map[string]Handler{"wait": wait})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start within 10 s")
	}
	f.mu.Lock()
	f.cancelled["a"] = true // the next heartbeat answer lists the lease
	f.mu.Unlock()
	cancelledAt := time.Now()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("the handler's context did not end within 2 s of the cancel")
	}
	t.Logf("handler context ended %v after the cancel", time.Since(cancelledAt))
	f.reported(t, 1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if item := f.fails["a"]; item == nil || item.Mode != dtqpb.FailMode_FAIL_MODE_CANCELLED {
		t.Fatalf("want lease a failed FAIL_MODE_CANCELLED, got %v", f.fails)
	}
}

func TestTimeoutFailsTheTaskRetryablyWithClassTimeout(t *testing.T) {
	tk := task("a", "wait")
	tk.TimeoutMs = 100
	f := newFakeBroker(&dtqpb.LeaseResponse{Kind: &dtqpb.LeaseResponse_Task{Task: tk}})
	wait := func(ctx context.Context, _ *dtqpb.LeasedTask) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	_, stop := start(t, f, WorkerConfig{Concurrency: 1}, map[string]Handler{"wait": wait})
	f.reported(t, 1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	item := f.fails["a"]
	if item == nil || item.ErrorClass != "Timeout" || item.XRetryable != nil {
		t.Fatalf("want lease a failed with class Timeout and retryable unset, got %v", item)
	}
}

func TestPermanentErrorIsSentNotRetryable(t *testing.T) {
	f := newFakeBroker(&dtqpb.LeaseResponse{Kind: &dtqpb.LeaseResponse_Task{Task: task("a", "bad")}})
	bad := func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
		return nil, &PermanentError{Message: "no"}
	}
	_, stop := start(t, f, WorkerConfig{Concurrency: 1}, map[string]Handler{"bad": bad})
	f.reported(t, 1)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.fails["a"].GetXRetryable().(*dtqpb.FailItem_Retryable)
	if !ok || r.Retryable {
		t.Fatalf("want retryable explicitly false, got %v", f.fails["a"])
	}
}

func TestHandlerErrorsMapToFailItems(t *testing.T) {
	f := newFakeBroker(batch(task("perm", "perm"), task("later", "later"), task("plain", "plain"),
		task("panic", "panic"), task("unknown", "nobody")))
	_, stop := start(t, f, WorkerConfig{Concurrency: 5, MaxBatch: 5}, map[string]Handler{
		"perm": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
			return nil, &PermanentError{Message: "no"}
		},
		"later": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
			return nil, &RetryAfterError{Message: "busy", After: 1500 * time.Millisecond}
		},
		"plain": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
			return nil, errors.New("boom")
		},
		"panic": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) { panic("oops") },
	})
	f.reported(t, 5)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	retryable := func(item *dtqpb.FailItem) bool {
		r, ok := item.GetXRetryable().(*dtqpb.FailItem_Retryable)
		return !ok || r.Retryable // unset = true
	}
	want := map[string]struct {
		class     string
		retryable bool
		afterMs   uint64
	}{"perm": {"PermanentError", false, 0}, "later": {"RetryAfterError", true, 1500},
		"plain": {"Error", true, 0}, "panic": {"Panic", true, 0},
		"unknown": {"UnknownTaskType", false, 0}}
	for id, w := range want {
		item := f.fails[id]
		if item == nil || item.ErrorClass != w.class || retryable(item) != w.retryable ||
			item.RetryAfterMs != w.afterMs || item.Mode != dtqpb.FailMode_FAIL_MODE_FAILURE {
			t.Errorf("lease %s: got %v, want class %s retryable %v retry_after_ms %d",
				id, item, w.class, w.retryable, w.afterMs)
		}
	}
}

func TestStuckHandlerIsReportedOnTimeButKeepsItsSlot(t *testing.T) {
	release := make(chan struct{})
	second := make(chan struct{}, 1)
	stuck := task("a", "stuck")
	stuck.TimeoutMs = 100
	f := newFakeBroker(batch(stuck, task("b", "next")))
	_, stop := start(t, f, WorkerConfig{Concurrency: 1, MaxBatch: 2}, map[string]Handler{
		"stuck": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
			<-release // ignores its ctx
			return nil, nil
		},
		"next": func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
			second <- struct{}{}
			return nil, nil
		},
	})
	f.reported(t, 1) // the Timeout, while the handler still runs
	f.mu.Lock()
	item := f.fails["a"]
	f.mu.Unlock()
	if item == nil || item.ErrorClass != "Timeout" {
		t.Fatalf("want lease a failed Timeout first, got %v", item)
	}
	select {
	case <-second:
		t.Fatal("the next task started while the stuck handler held the only slot")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-second
	f.reported(t, 2)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestUnansweredAcksAreResentAndStaleOnesDropped(t *testing.T) {
	f := newFakeBroker(batch(task("a", "echo"), task("s", "echo")))
	f.failFirst = true
	f.stale["s"] = true
	w, stop := start(t, f, WorkerConfig{Concurrency: 2, MaxBatch: 2},
		map[string]Handler{"echo": echoHandler})
	f.reported(t, 1) // lease a acked by a resend
	deadline := time.Now().Add(10 * time.Second)
	for w.Counters().Stale < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polled with a deadline
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c := w.Counters()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ackCalls < 2 || c.Processed != 1 || c.Stale != 1 || f.acks["s"] != nil {
		t.Fatalf("ack calls %d, counters %+v: want a resend after UNAVAILABLE, a processed, "+
			"s dropped as stale", f.ackCalls, c)
	}
}
