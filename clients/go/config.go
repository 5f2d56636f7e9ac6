package dtq

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ConfigFromEnv reads the environment conventions of the reference workers:
// DTQ_GATEWAY (host:port), DTQ_QUEUES (comma-separated; DTQ_QUEUE for one),
// DTQ_WORKER_ID, DTQ_CONCURRENCY, DTQ_MAX_IN_FLIGHT, DTQ_MAX_BATCH (0..256),
// DTQ_DRAIN_GRACE_MS, DTQ_TOKEN, DTQ_TLS (1, true, yes or on, any case: TLS with the
// system roots) and DTQ_TLS_CA (CA bundle path; setting it turns TLS on), as the Python
// and Node workers read them. Unset variables leave the WorkerConfig defaults.
//
// Errors: a DTQ_GATEWAY that CheckTarget refuses (the error names DTQ_GATEWAY), a
// number variable that is not a non-negative integer.
func ConfigFromEnv() (WorkerConfig, error) {
	cfg := WorkerConfig{Conn: ConnConfig{Target: strings.TrimSpace(os.Getenv("DTQ_GATEWAY")),
		Token: os.Getenv("DTQ_TOKEN"), CAFile: strings.TrimSpace(os.Getenv("DTQ_TLS_CA"))},
		WorkerID: os.Getenv("DTQ_WORKER_ID")}
	if cfg.Conn.Target != "" {
		if err := CheckTarget(cfg.Conn.Target, "DTQ_GATEWAY"); err != nil {
			return cfg, err
		}
	}
	cfg.Conn.TLS = envTrue(os.Getenv("DTQ_TLS")) || cfg.Conn.CAFile != ""
	queues := os.Getenv("DTQ_QUEUES")
	if queues == "" {
		queues = os.Getenv("DTQ_QUEUE")
	}
	for _, q := range strings.Split(queues, ",") {
		if q = strings.TrimSpace(q); q != "" {
			cfg.Queues = append(cfg.Queues, q)
		}
	}
	ints := map[string]*int{"DTQ_CONCURRENCY": &cfg.Concurrency,
		"DTQ_MAX_IN_FLIGHT": &cfg.MaxInFlight, "DTQ_MAX_BATCH": &cfg.MaxBatch}
	var graceMs int
	ints["DTQ_DRAIN_GRACE_MS"] = &graceMs
	for name, dst := range ints {
		raw := os.Getenv(name)
		if raw == "" {
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("dtq: %s=%q is not a non-negative integer", name, raw)
		}
		*dst = n
	}
	cfg.DrainGrace = time.Duration(graceMs) * time.Millisecond
	return cfg, nil
}

// envTrue reports whether a boolean environment value is on: 1, true, yes or on, in any
// case, blanks around ignored (the reference workers' convention).
func envTrue(raw string) bool {
	switch strings.ToLower(strings.TrimSpace(raw)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}
