package brokers

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/internal/edge"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaIDHeader is the record header that carries an event's ID for
// [ConsumeKafka]: "ce_id", the id attribute of the CloudEvents Kafka
// binding. Not the record's offset: a producer that retries without
// idempotence writes the same event at two offsets.
const KafkaIDHeader = "ce_id"

// ConsumeKafka polls batches of up to o.Batch records from the consumer
// group client cl and hands each batch to h, until ctx is done (it then
// returns ctx's error) or cl is closed (kgo.ErrClientClosed). The event ID
// of a record is its [KafkaIDHeader] header; a record without one is
// dead-lettered (ErrInvalidKey).
//
// Kafka acknowledges a partition's records by committing an offset, so a
// record answered Retry cannot be skipped: it is handled again in place,
// after [Options.RetryDelay] (or the time left on the lease of the
// delivery that holds it), until it is answered Ack or DeadLetter, and the
// batch's offsets are committed after that (cl.CommitRecords). The other
// records of the batch are not held back: a retry does not keep the order
// of a partition's records. A record answered DeadLetter is committed
// after [Options.DeadLetter].
//
// A consumer that dies, or whose partitions move to another member of the
// group (a rebalance, also in the middle of a batch), leaves its batch's
// offsets uncommitted: the next owner of a partition gets its records again
// and the inbox replays those whose batch completed, reports in progress
// those still held by the old owner (handled again in place here until
// its batch ends or its lease does) and runs the rest. The commit of an
// old owner whose generation ended fails; its records are committed by the
// next owner. Committing only records that were handled, in order, is what
// makes the commits safe without blocking rebalances during a poll.
//
// cl must consume as a group member (kgo.ConsumerGroup) with
// kgo.DisableAutoCommit: ConsumeKafka returns an error wrapping
// [idempotency.ErrInvalidArgument] naming the option otherwise, since
// autocommit commits records before they are handled and a crash would
// then lose them.
func ConsumeKafka(ctx context.Context, cl *kgo.Client, h BatchHandler, opts *Options) error {
	o, err := opts.withDefaults("ConsumeKafka", h)
	if err != nil {
		return err
	}
	switch {
	case cl == nil:
		return fmt.Errorf("%w: brokers: ConsumeKafka: nil client", idempotency.ErrInvalidArgument)
	case cl.OptValue(kgo.ConsumerGroup) == "":
		return fmt.Errorf("%w: brokers: ConsumeKafka: the client is not a group consumer (kgo.ConsumerGroup)", idempotency.ErrInvalidArgument)
	case cl.OptValue(kgo.DisableAutoCommit) != true:
		return fmt.Errorf("%w: brokers: ConsumeKafka: the client commits offsets by itself: give it kgo.DisableAutoCommit()", idempotency.ErrInvalidArgument)
	}
	for {
		recs, err := pollKafka(ctx, cl, &o)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			continue
		}
		msgs := make([]inbox.Message, len(recs))
		for i, r := range recs {
			msgs[i] = inbox.Message{Source: o.Source, Payload: r.Value}
			if msgs[i].Source == "" {
				msgs[i].Source = r.Topic
			}
			for _, hd := range r.Headers {
				if hd.Key == KafkaIDHeader {
					msgs[i].ID = string(hd.Value)
				}
			}
		}
		ds := make([]inbox.Delivery, len(recs))
		pending := make([]int, len(recs))
		for i := range pending {
			pending[i] = i
		}
		for len(pending) > 0 {
			sub := make([]inbox.Message, len(pending))
			for k, i := range pending {
				sub[k] = msgs[i]
			}
			var again []int
			var delay = o.RetryDelay
			for k, d := range o.handle(ctx, h, sub) {
				i := pending[k]
				if d = o.deadLetter(ctx, msgs[i], d); d.Disposition == inbox.Retry {
					again = append(again, i)
					delay = min(delay, o.retryDelay(d))
				}
				ds[i] = d
			}
			if pending = again; len(pending) > 0 {
				if err := edge.Sleep(ctx, delay); err != nil {
					return err
				}
			}
		}
		err = cl.CommitRecords(ctx, recs...)
		for i := range recs {
			o.settled(msgs[i], ds[i], err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// pollKafka returns the next records: those PollRecords gives at once, and
// more until o.Batch or o.MaxWait.
func pollKafka(ctx context.Context, cl *kgo.Client, o *Options) ([]*kgo.Record, error) {
	fs := cl.PollRecords(ctx, o.Batch)
	if err := pollErr(ctx, fs); err != nil {
		return nil, err
	}
	recs := fs.Records()
	if len(recs) == 0 || len(recs) >= o.Batch {
		return recs, nil
	}
	wctx, cancel := context.WithTimeout(ctx, o.MaxWait)
	defer cancel()
	for len(recs) < o.Batch && wctx.Err() == nil {
		fs := cl.PollRecords(wctx, o.Batch-len(recs))
		if err := pollErr(ctx, fs); err != nil {
			return nil, err
		}
		recs = append(recs, fs.Records()...)
	}
	return recs, nil
}

// pollErr returns the error that ends the loop: the client closed, ctx
// done. Other fetch errors are the client's to retry.
func pollErr(ctx context.Context, fs kgo.Fetches) error {
	if fs.IsClientClosed() {
		return kgo.ErrClientClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var fatal error
	fs.EachError(func(_ string, _ int32, err error) {
		if errors.Is(err, kgo.ErrClientClosed) {
			fatal = err
		}
	})
	return fatal
}
