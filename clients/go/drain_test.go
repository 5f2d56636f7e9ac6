package dtq

import (
	"context"
	"io/ioutil"
	"log"
	"net"
	"testing"
	"time"
)

// A worker that never reached its gateway has no Lease stream whose end the drain could
// wait for: on SIGTERM it returns at once instead of after 2 heartbeat intervals (20 s
// with the default interval), which would eat most of a pod's termination grace period.
func TestDrainWithoutAnOpenStreamDoesNotWaitForOne(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there: every dial is refused
	w := NewWorker(WorkerConfig{Conn: ConnConfig{Target: target}, Queues: []string{"q"},
		Logger: log.New(ioutil.Discard, "", 0)})
	w.Handle("t", echoHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still draining 10 s after its context ended, with no stream ever open")
	}
}
