// Command dtq-conformance-worker is the Go worker of the dtq conformance suite
// (tests/conformance/README.md): it reads the DTQ_* environment (see
// dtq.ConfigFromEnv; DTQ_MAX_BATCH defaults to 16 here), runs the task types conf.echo, conf.sleep and conf.fail
// (and the demo's file.* types on queue demo), drains on SIGTERM and exits 0,
// or exits 3 when the gateway refuses it (bad token, bad request).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	dtq "dtq/clients/go"
	"dtq/clients/go/dtqpb"
)

// defaultMaxBatch is LeaseRequest.max_batch when DTQ_MAX_BATCH is unset (a gateway
// that predates the field ignores it and sends one task per message).
const defaultMaxBatch = 16

func echo(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) { return t.Payload, nil }

// sleep: {"ms": N}; stops early when the worker stops the task.
func sleep(ctx context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
	var p struct{ Ms int64 }
	if err := decode(t.Payload, &p); err != nil {
		return nil, err
	}
	select {
	case <-time.After(time.Duration(p.Ms) * time.Millisecond):
		return json.Marshal(map[string]int64{"slept_ms": p.Ms})
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// fail: {"retryable": bool, "message": str}; always fails.
func fail(_ context.Context, t *dtqpb.LeasedTask) ([]byte, error) {
	p := struct {
		Retryable *bool
		Message   string
	}{}
	if err := decode(t.Payload, &p); err != nil {
		return nil, err
	}
	if p.Retryable != nil && !*p.Retryable {
		return nil, &dtq.PermanentError{Class: "ConfFailure", Message: p.Message}
	}
	return nil, errors.New(p.Message)
}

// decode reads a JSON payload (empty = no arguments); bad JSON fails permanently.
func decode(payload []byte, v interface{}) error {
	if len(payload) == 0 {
		return nil
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return &dtq.PermanentError{Class: "PayloadError", Message: err.Error()}
	}
	return nil
}

func main() {
	logger := log.New(os.Stderr, "dtq-go-worker ", log.LstdFlags|log.Lmicroseconds)
	cfg, err := dtq.ConfigFromEnv()
	if err != nil {
		logger.Print(err)
		os.Exit(2)
	}
	cfg.Logger = logger
	if os.Getenv("DTQ_MAX_BATCH") == "" {
		cfg.MaxBatch = defaultMaxBatch // batched delivery where the gateway grants it
	}
	w := dtq.NewWorker(cfg)
	w.Handle("conf.echo", echo)
	w.Handle("conf.sleep", sleep)
	w.Handle("conf.fail", fail)
	registerDemo(w)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = w.Run(ctx)
	c := w.Counters()
	out, _ := json.Marshal(map[string]interface{}{"worker": "go", "worker_id": cfg.WorkerID,
		"processed": c.Processed, "failed": c.Failed, "released": c.Released,
		"cancelled": c.Cancelled, "lost": c.Stale, "batches": c.Batches})
	fmt.Println(string(out))
	if err != nil {
		logger.Print(err)
		os.Exit(3)
	}
}
