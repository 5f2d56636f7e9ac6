package dtq

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"dtq/clients/go/dtqpb"
)

// SDK names this implementation in LeaseRequest.sdk.
const SDK = "dtq-go-worker/0.1.0"

// drainStreamMin is the shortest wait for the Lease stream to end after the
// draining heartbeat (the bound is max(2 s, 2 heartbeat intervals)).
const drainStreamMin = 2 * time.Second

// Handler runs one task. Its ctx is cancelled when the worker stops the task:
// timeout_ms passed, the task was cancelled, the lease was lost, or the drain's
// grace period ended. It returns the result bytes to Ack, or an error to Fail:
// a *PermanentError fails without retry, a *RetryAfterError sets the retry
// delay, any other error is retryable with the error's type as error class.
type Handler func(ctx context.Context, task *dtqpb.LeasedTask) ([]byte, error)

// WorkerConfig configures a Worker. Zero fields take the defaults given.
type WorkerConfig struct {
	Conn ConnConfig
	// Queues to lease from, 1..32 names, strict priority across them. Required.
	Queues []string
	// WorkerID, `[A-Za-z0-9_.:@-]{1,128}` (default <host>-<pid>-<random>).
	WorkerID string
	// Concurrency is the number of handler slots (default 4).
	Concurrency int
	// MaxInFlight is the most leases held at once, 1..10000 (default 2 x Concurrency).
	MaxInFlight int
	// MaxBatch asks for batched delivery: at most this many tasks per Lease stream
	// message, 0..256 (0 or 1: one task per message).
	MaxBatch int
	// DrainGrace is how long running handlers may finish after the drain begins
	// (default 30 s); then they are stopped and their tasks released.
	DrainGrace time.Duration
	// Labels are shown by ListWorkers (at most 32).
	Labels map[string]string
	// Logger (default: the standard logger, prefix "dtq-worker ").
	Logger *log.Logger
}

// Counters are the worker's cumulative outcomes, by the gateway's answers.
type Counters struct {
	Processed, Failed, Released, Cancelled, Stale uint64
	// Batches counts the Lease stream messages that carried a LeaseResponse.batch.
	Batches uint64
}

// Worker leases tasks of its queues and runs them with the registered handlers.
type Worker struct {
	cfg      WorkerConfig
	handlers map[string]Handler
	log      *log.Logger
	host     string

	conn   *grpc.ClientConn
	stub   dtqpb.BrokerClient
	mu     sync.Mutex
	held   map[string]*lease
	ready  chan *lease
	rep    *reporter
	hbMs   int64         // heartbeat interval in ms (atomic)
	open   int32         // 1 while a Lease stream has its SessionInfo and has not ended (atomic)
	drain  chan struct{} // closed when the drain begins
	fatal  error         // set once when the gateway refuses the worker
	cancel context.CancelFunc

	processed, failed, released, cancelled, stale, batches uint64 // atomic counters
}

// NewWorker returns a worker for cfg; register handlers with Handle, then Run.
func NewWorker(cfg WorkerConfig) *Worker {
	host, _ := os.Hostname()
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 2 * cfg.Concurrency
	}
	if cfg.DrainGrace <= 0 {
		cfg.DrainGrace = 30 * time.Second
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = fmt.Sprintf("%s-%d-%06x", host, os.Getpid(), time.Now().UnixNano()&0xffffff)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = log.New(os.Stderr, "dtq-worker ", log.LstdFlags|log.Lmicroseconds)
	}
	return &Worker{cfg: cfg, handlers: map[string]Handler{}, log: logger, host: host,
		held: map[string]*lease{}, hbMs: 10000,
		drain: make(chan struct{})}
}

// Handle registers the handler of one task type. Call it before Run.
func (w *Worker) Handle(taskType string, h Handler) { w.handlers[taskType] = h }

// Counters returns the outcomes counted so far.
func (w *Worker) Counters() Counters {
	return Counters{atomic.LoadUint64(&w.processed), atomic.LoadUint64(&w.failed),
		atomic.LoadUint64(&w.released), atomic.LoadUint64(&w.cancelled),
		atomic.LoadUint64(&w.stale), atomic.LoadUint64(&w.batches)}
}

// ErrRefused wraps the status with which the gateway refused the worker
// (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT): retrying cannot help.
var ErrRefused = errors.New("dtq: the gateway refused the worker")

// Run leases and runs tasks until ctx is cancelled, then drains (docs/protocol.md
// section 9) and returns nil once every held lease is reported. It returns an
// error wrapping ErrRefused when the gateway refuses the worker, or a dial error.
func (w *Worker) Run(ctx context.Context) error {
	if len(w.cfg.Queues) == 0 {
		return errors.New("dtq: WorkerConfig.Queues is empty")
	}
	conn, err := Dial(w.cfg.Conn)
	if err != nil {
		return err
	}
	defer conn.Close()
	w.conn, w.stub = conn, dtqpb.NewBrokerClient(conn)
	w.ready = make(chan *lease, w.cfg.MaxInFlight+10000)
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.cancel = cancel
	w.rep = newReporter(w)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); w.rep.run(runCtx) }()
	go func() { defer bg.Done(); w.heartbeatLoop(runCtx) }()
	for i := 0; i < w.cfg.Concurrency; i++ {
		go w.slotLoop(runCtx)
	}
	streamCtx, stopStream := context.WithCancel(runCtx)
	defer stopStream()
	streamDone := make(chan struct{})
	go func() { defer close(streamDone); w.leaseLoop(streamCtx) }()
	select {
	case <-ctx.Done():
	case <-w.drain: // refused: leaseLoop began the stop
	}
	w.drainSteps(streamDone, stopStream)
	cancel()
	bg.Wait()
	return w.fatalErr()
}

func (w *Worker) fatalErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatal
}

// beginDrain marks the worker draining (idempotent); true on the first call.
func (w *Worker) beginDrain() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.drain:
		return false
	default:
		close(w.drain)
		return true
	}
}

func (w *Worker) draining() bool {
	select {
	case <-w.drain:
		return true
	default:
		return false
	}
}

// drainSteps: stop starting tasks, heartbeat draining=true, read the stream to
// its end (bounded), release what will not run, give running handlers the grace
// period, then wait (bounded) for the answers to every report.
func (w *Worker) drainSteps(streamDone chan struct{}, stopStream context.CancelFunc) {
	w.beginDrain()
	graceEnd := time.Now().Add(w.cfg.DrainGrace)
	grace := time.AfterFunc(w.cfg.DrainGrace, func() { w.stopAll(reasonDrain) })
	defer grace.Stop()
	w.releaseBuffered()
	// no open stream (the gateway was never reached, or its stream just ended): there
	// is no stream end to wait for, so the drain does not sit out 2 heartbeat intervals
	if w.fatalErr() == nil && atomic.LoadInt32(&w.open) == 1 {
		w.beat(context.Background())
		wait := 2 * time.Duration(atomic.LoadInt64(&w.hbMs)) * time.Millisecond
		if wait < drainStreamMin {
			wait = drainStreamMin
		}
		select {
		case <-streamDone:
		case <-time.After(wait):
			w.log.Printf("lease stream did not end within %v of the draining heartbeat", wait)
		}
	}
	stopStream()
	<-streamDone
	w.releaseBuffered()
	deadline := graceEnd.Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if w.heldCount() == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := w.heldCount(); n > 0 {
		w.log.Printf("exiting with %d leases unreported", n)
	}
}

func (w *Worker) heldCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}

// refuse records a fatal refusal and starts the stop.
func (w *Worker) refuse(err error) {
	w.mu.Lock()
	if w.fatal == nil {
		w.fatal = fmt.Errorf("%w: %v", ErrRefused, err)
	}
	w.mu.Unlock()
	w.log.Printf("stopping: %v", err)
	w.beginDrain()
}
