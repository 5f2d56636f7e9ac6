package dtq

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"dtq/clients/go/dtqpb"
)

// Reports are coalesced for at most batchWait or batchMax items per call.
const (
	batchWait = 5 * time.Millisecond
	batchMax  = 256
)

// report is one Ack or Fail item waiting for its answer.
type report struct {
	l     *lease
	ack   *dtqpb.AckItem
	fail  *dtqpb.FailItem
	tries int
}

// reporter sends batched Ack and Fail calls and acts on each item's answer.
type reporter struct {
	w     *Worker
	items chan *report
}

func newReporter(w *Worker) *reporter {
	return &reporter{w: w, items: make(chan *report, 4*batchMax)}
}

func (r *reporter) ack(l *lease, result []byte) {
	r.items <- &report{l: l, ack: &dtqpb.AckItem{LeaseId: l.task.LeaseId, Result: result}}
}

func (r *reporter) fail(l *lease, item *dtqpb.FailItem) {
	r.items <- &report{l: l, fail: item}
}

// run collects reports into calls of at most batchMax items until ctx ends.
func (r *reporter) run(ctx context.Context) {
	for {
		var batch []*report
		select {
		case <-ctx.Done():
			return
		case first := <-r.items:
			batch = append(batch, first)
		}
		timer := time.NewTimer(batchWait)
	collect:
		for len(batch) < batchMax {
			select {
			case it := <-r.items:
				batch = append(batch, it)
			case <-timer.C:
				break collect
			}
		}
		timer.Stop()
		var acks, fails []*report
		for _, it := range batch {
			if it.ack != nil {
				acks = append(acks, it)
			} else {
				fails = append(fails, it)
			}
		}
		if len(acks) > 0 {
			go r.send(ctx, acks)
		}
		if len(fails) > 0 {
			go r.send(ctx, fails)
		}
	}
}

// send makes one Ack or Fail call for items (all of one kind) and settles each.
func (r *reporter) send(ctx context.Context, items []*report) {
	results, err := r.call(ctx, items)
	if err != nil {
		s, _ := status.FromError(err)
		if len(items) == 1 && s.Code() != codes.Unavailable && s.Code() != codes.DeadlineExceeded &&
			s.Code() != codes.Canceled && s.Code() != codes.Unknown {
			r.settle(ctx, items[0], s.Code(), s.Message()) // a single item's error is the call's
			return
		}
		for _, it := range items {
			r.retry(ctx, it, err.Error())
		}
		return
	}
	for i, it := range items {
		if i >= len(results) || results[i].Error == nil {
			r.settle(ctx, it, codes.OK, "")
			continue
		}
		e := results[i].Error
		r.settle(ctx, it, codes.Code(e.Code), e.Reason+": "+e.Message)
	}
}

// call sends items as one Ack or Fail request (deadline callTimeout); the per-item
// results in request order, or the call's error.
func (r *reporter) call(ctx context.Context, items []*report) ([]*dtqpb.LeaseResult, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if items[0].ack != nil {
		req := &dtqpb.AckRequest{}
		for _, it := range items {
			req.Items = append(req.Items, it.ack)
		}
		resp, err := r.w.stub.Ack(cctx, req)
		return resp.GetResults(), err
	}
	req := &dtqpb.FailRequest{}
	for _, it := range items {
		req.Items = append(req.Items, it.fail)
	}
	resp, err := r.w.stub.Fail(cctx, req)
	return resp.GetResults(), err
}

// settle acts on one item's answer (docs/protocol.md 6.2).
func (r *reporter) settle(ctx context.Context, it *report, code codes.Code, msg string) {
	w := r.w
	switch code {
	case codes.OK:
		w.forget(it.l, r.counter(it))
	case codes.FailedPrecondition, codes.NotFound:
		w.forget(it.l, &w.stale) // fencing: the lease is no longer current
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		w.log.Printf("report of %s refused (%s %s); dropped", it.l.task.LeaseId, code, msg)
		w.forget(it.l, &w.stale)
	default:
		r.retry(ctx, it, code.String()+" "+msg)
	}
}

// retry resends an item after a jittered backoff, until the worker stops.
func (r *reporter) retry(ctx context.Context, it *report, why string) {
	it.tries++
	if it.tries == 1 || it.tries%10 == 0 {
		r.w.log.Printf("report of %s not answered (%s); resending", it.l.task.LeaseId, why)
	}
	time.AfterFunc(backoffDelay(it.tries), func() {
		select {
		case <-ctx.Done():
		case r.items <- it:
		}
	})
}

func (r *reporter) counter(it *report) *uint64 {
	w := r.w
	if it.ack != nil {
		return &w.processed
	}
	switch it.fail.Mode {
	case dtqpb.FailMode_FAIL_MODE_RELEASE:
		return &w.released
	case dtqpb.FailMode_FAIL_MODE_CANCELLED:
		return &w.cancelled
	}
	return &w.failed
}

func addOne(counter *uint64) { atomic.AddUint64(counter, 1) }
