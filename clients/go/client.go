package dtq

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"dtq/clients/go/dtqpb"
)

// Client is a producer: it enqueues tasks and reads their state. It is safe
// for concurrent use; one Client (one connection) per process is enough.
type Client struct {
	conn *grpc.ClientConn
	// Broker is the raw stub, for the calls Client does not wrap.
	Broker dtqpb.BrokerClient
}

// NewClient connects to the gateway described by cfg (see Dial).
func NewClient(cfg ConnConfig) (*Client, error) {
	conn, err := Dial(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, Broker: dtqpb.NewBrokerClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Enqueue adds one task. queue and task_type are required; a bad field is
// answered INVALID_ARGUMENT naming it. With an idempotency key a repeat returns
// the first task (EnqueueResponse.deduplicated).
func (c *Client) Enqueue(ctx context.Context, req *dtqpb.EnqueueRequest) (*dtqpb.EnqueueResponse, error) {
	return c.Broker.Enqueue(ctx, req)
}

// EnqueueBatch adds 1..1000 tasks; each item is answered on its own
// (EnqueueBatchResult.error), in request order.
func (c *Client) EnqueueBatch(ctx context.Context, reqs []*dtqpb.EnqueueRequest) ([]*dtqpb.EnqueueBatchResult, error) {
	resp, err := c.Broker.EnqueueBatch(ctx, &dtqpb.EnqueueBatchRequest{Items: reqs})
	if err != nil {
		return nil, err
	}
	return resp.Results, nil
}

// GetTask returns the task record (NOT_FOUND when unknown or past retention).
func (c *Client) GetTask(ctx context.Context, taskID string) (*dtqpb.Task, error) {
	resp, err := c.Broker.GetTask(ctx, &dtqpb.GetTaskRequest{TaskId: taskID})
	if err != nil {
		return nil, err
	}
	return resp.Task, nil
}

// Terminal reports whether a status is final (the task will not run again).
func Terminal(s dtqpb.TaskStatus) bool {
	switch s {
	case dtqpb.TaskStatus_TASK_STATUS_SUCCEEDED, dtqpb.TaskStatus_TASK_STATUS_DEAD_LETTERED,
		dtqpb.TaskStatus_TASK_STATUS_CANCELLED, dtqpb.TaskStatus_TASK_STATUS_EXPIRED:
		return true
	}
	return false
}

// Wait polls GetTask every poll (default 50 ms) until the task is terminal or
// ctx ends. It returns the task; a task that ended without success (DEAD_LETTERED,
// CANCELLED, EXPIRED) comes with a *TaskFailedError. A GetTask error or ctx's
// error ends the wait.
func (c *Client) Wait(ctx context.Context, taskID string, poll time.Duration) (*dtqpb.Task, error) {
	if poll <= 0 {
		poll = 50 * time.Millisecond
	}
	for {
		task, err := c.GetTask(ctx, taskID)
		if err != nil {
			return nil, err
		}
		if Terminal(task.Status) {
			if task.Status != dtqpb.TaskStatus_TASK_STATUS_SUCCEEDED {
				return task, &TaskFailedError{Task: task}
			}
			return task, nil
		}
		select {
		case <-ctx.Done():
			return task, ctx.Err()
		case <-time.After(poll):
		}
	}
}
