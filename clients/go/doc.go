// Package dtq is the Go client of dtq: a Worker that leases tasks from a dtq
// gateway over gRPC and runs them with handlers chosen by task type, and a
// Client that enqueues tasks and waits for their outcome.
//
// A worker speaks the dtq.v1 worker protocol (docs/protocol.md): one Lease
// stream per process (optionally with batched delivery, LeaseRequest.max_batch),
// Heartbeat every heartbeat_interval_ms listing every held lease, batched Ack
// and Fail, lost and cancelled leases honoured, reconnect with jittered
// exponential backoff, and a graceful drain (draining heartbeat, the stream read
// to its end, running handlers finished within a grace period, everything else
// released with FAIL_MODE_RELEASE).
//
// The generated stubs live in the dtqpb package.
package dtq
