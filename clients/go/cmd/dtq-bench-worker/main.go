// Command dtq-bench-worker is the Go worker of the scale bench (bench/go_worker.py):
// a gated Worker with a no-op "noop" handler that records each task in the
// bench's counter file (bench/scale_probe.py: count, first and last handler time
// in CLOCK_MONOTONIC ns, little-endian int64s, memory-mapped).
//
// Environment: the DTQ_* variables of dtq.ConfigFromEnv, BENCH_SCALE_COUNTER (the
// counter file) and BENCH_SCALE_READY (written once started; the worker then waits
// for SIGUSR1 before it connects).
package main

import (
	"context"
	"encoding/binary"
	"log"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	dtq "dtq/clients/go"
	"dtq/clients/go/dtqpb"
)

// counter is the worker side of a scale_probe counter file.
type counter struct {
	mu           sync.Mutex
	mem          []byte
	count, first int64
}

func openCounter(path string) (*counter, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 24, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	return &counter{mem: mem}, nil
}

func monotonicNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// hit records one handled task.
func (c *counter) hit() {
	now := monotonicNs()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count == 0 {
		c.first = now
	}
	c.count++
	binary.LittleEndian.PutUint64(c.mem[0:], uint64(c.count))
	binary.LittleEndian.PutUint64(c.mem[8:], uint64(c.first))
	binary.LittleEndian.PutUint64(c.mem[16:], uint64(now))
}

// waitForGo writes the ready file (atomically) and blocks until SIGUSR1.
func waitForGo(ready string) error {
	gate := make(chan os.Signal, 1)
	signal.Notify(gate, syscall.SIGUSR1) // stays caught: a second SIGUSR1 is ignored
	if err := os.WriteFile(ready+".part", []byte("go"), 0o644); err != nil {
		return err
	}
	if err := os.Rename(ready+".part", ready); err != nil {
		return err
	}
	<-gate
	return nil
}

func main() {
	logger := log.New(os.Stderr, "dtq-bench-worker ", log.LstdFlags)
	cfg, err := dtq.ConfigFromEnv()
	if err != nil {
		logger.Fatal(err)
	}
	cfg.Logger = logger
	c, err := openCounter(os.Getenv("BENCH_SCALE_COUNTER"))
	if err != nil {
		logger.Fatal(err)
	}
	w := dtq.NewWorker(cfg)
	w.Handle("noop", func(context.Context, *dtqpb.LeasedTask) ([]byte, error) {
		c.hit()
		return nil, nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := waitForGo(os.Getenv("BENCH_SCALE_READY")); err != nil {
		logger.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		logger.Fatal(err)
	}
}
