package dtq

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"dtq/clients/go/dtqpb"
)

// TestProducer runs against a real gateway (DTQ_TEST_GATEWAY) whose queue
// DTQ_TEST_QUEUE is served by a worker answering "ok" with {"echo": payload}
// and failing "boom" permanently (tests/conformance/test_go_client.py sets it up).
func TestProducer(t *testing.T) {
	target, queue := os.Getenv("DTQ_TEST_GATEWAY"), os.Getenv("DTQ_TEST_QUEUE")
	if target == "" || queue == "" {
		t.Skip("DTQ_TEST_GATEWAY / DTQ_TEST_QUEUE not set (run by tests/conformance/test_go_client.py)")
	}
	c, err := NewClient(ConnConfig{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("EnqueueAndWaitReturnsTheResult", func(t *testing.T) {
		resp, err := c.Enqueue(ctx, &dtqpb.EnqueueRequest{Queue: queue, TaskType: "ok",
			Payload: []byte(`{"n":1}`), ContentType: "application/json"})
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.Wait(ctx, resp.TaskId, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Echo struct{ N int } }
		if err := json.Unmarshal(task.Result, &got); err != nil || got.Echo.N != 1 {
			t.Fatalf("result %q (err %v), want echo n=1", task.Result, err)
		}
	})
	t.Run("EnqueueBatchAnswersEveryItem", func(t *testing.T) {
		var reqs []*dtqpb.EnqueueRequest
		for i := 0; i < 3; i++ {
			reqs = append(reqs, &dtqpb.EnqueueRequest{Queue: queue, TaskType: "ok",
				Payload: []byte(`{}`), ContentType: "application/json"})
		}
		reqs = append(reqs, &dtqpb.EnqueueRequest{Queue: "bad queue!", TaskType: "ok"})
		results, err := c.EnqueueBatch(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if len(results) != 4 || results[3].Error == nil || results[3].Error.Field != "items[3].queue" {
			t.Fatalf("want 4 results, the last refused naming queue: %v", results)
		}
		for _, r := range results[:3] {
			if task, err := c.Wait(ctx, r.TaskId, 0); err != nil ||
				task.Status != dtqpb.TaskStatus_TASK_STATUS_SUCCEEDED {
				t.Fatalf("task %s: %v %v", r.TaskId, task, err)
			}
		}
	})
	t.Run("WaitReturnsTaskFailedErrorForADeadLetteredTask", func(t *testing.T) {
		resp, err := c.Enqueue(ctx, &dtqpb.EnqueueRequest{Queue: queue, TaskType: "boom"})
		if err != nil {
			t.Fatal(err)
		}
		task, err := c.Wait(ctx, resp.TaskId, 0)
		var failed *TaskFailedError
		if !errors.As(err, &failed) || task.Status != dtqpb.TaskStatus_TASK_STATUS_DEAD_LETTERED ||
			task.LastError != "kaput" {
			t.Fatalf("want TaskFailedError for a dead-lettered task, got %v, %v", task, err)
		}
	})
	t.Run("GetTaskOfAnUnknownIdIsNotFound", func(t *testing.T) {
		_, err := c.GetTask(ctx, "0123456789abcdef0123456789abcdef")
		if status.Code(err) != codes.NotFound {
			t.Fatalf("want NOT_FOUND, got %v", err)
		}
	})
	t.Run("EnqueueWithABadQueueIsInvalidArgument", func(t *testing.T) {
		_, err := c.Enqueue(ctx, &dtqpb.EnqueueRequest{Queue: "bad queue!", TaskType: "ok"})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("want INVALID_ARGUMENT, got %v", err)
		}
	})
}
