// Package brokers consumes NATS JetStream, Kafka and RabbitMQ through an
// [inbox.Inbox]: each poll's messages are handled as one batch
// ([inbox.Inbox.HandleBatch]: their events claimed in one store round trip
// and recorded in one more), and each message is then acknowledged,
// delivered again later or dead-lettered as its [inbox.Delivery] says.
//
// The trials of the module (brokers/internal/trial) run these very
// functions against real brokers, with the consumer processes killed at
// random points, and count every message's effect (see README.md).
//
// What a message's Disposition becomes on each broker:
//
//	             NATS JetStream        Kafka (consumer group)             RabbitMQ
//	Ack          Ack                   offset committed                   basic.ack
//	Retry        NakWithDelay          handled again in place, after      basic.nack, requeue
//	                                   a delay; later offsets wait
//	DeadLetter   Options.DeadLetter,   Options.DeadLetter, then the       Options.DeadLetter, then
//	             then Term             offset committed                   basic.nack without requeue
//	                                                                      (the queue's dead-letter
//	                                                                      exchange, if it has one)
package brokers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
)

// A BatchHandler handles the messages of one poll and returns one
// [inbox.Delivery] per message, in order. [Batch] makes one from an inbox;
// for effects that are rows in the inbox's PostgreSQL database, a closure
// over the PostgreSQL adapter's InboxBatchTx records each batch in one
// transaction with them (see the package's README).
type BatchHandler func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery

// Batch returns the BatchHandler that hands msgs to in.HandleBatch: handle
// runs for each message whose event this consumer has not processed
// before, one after another, and the events of the batch are claimed in
// one store call and recorded in one more.
//
// handle's effects outside the inbox's store happen once per event unless
// the process dies between an effect and the end of its batch: the events
// of that batch are then handled again once their leases end. Where the
// effects are rows in the PostgreSQL database of the inbox, the PostgreSQL
// adapter's InboxBatchTx makes them exactly-once.
//
// It returns an error wrapping [idempotency.ErrInvalidArgument] for a nil
// inbox or handler.
func Batch(in *inbox.Inbox, handle func(ctx context.Context, msg inbox.Message) error) (BatchHandler, error) {
	switch {
	case in == nil:
		return nil, fmt.Errorf("%w: brokers: Batch: nil inbox", idempotency.ErrInvalidArgument)
	case handle == nil:
		return nil, fmt.Errorf("%w: brokers: Batch: nil handler", idempotency.ErrInvalidArgument)
	}
	return func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery {
		return in.HandleBatch(ctx, msgs, func(ctx context.Context, i int) error { return handle(ctx, msgs[i]) })
	}, nil
}

// Options configure a consumer loop. The zero value (or nil) means the
// defaults.
type Options struct {
	// Batch is the most messages one poll takes and hands to the
	// BatchHandler. Default 100.
	Batch int
	// MaxWait bounds how long a poll waits for more messages once it has
	// one (Kafka and RabbitMQ) or at all (NATS, whose Fetch then returns
	// what it has). Default 100ms; NATS takes at least 1ms.
	MaxWait time.Duration
	// RetryDelay is how long a message answered Retry waits before it is
	// handled again, where the broker can wait (NATS NakWithDelay, Kafka's
	// retry in place; RabbitMQ requeues at once): for a handler's
	// transient error, and at most this long for a store's hint (the time
	// left on the lease of another delivery of the event, handled
	// elsewhere right now). Default 1s.
	RetryDelay time.Duration
	// Source is the events' source in the inbox ([inbox.Message].Source).
	// Default: the stream's (NATS), the topic's (Kafka) or the queue's
	// (RabbitMQ) name.
	Source string
	// DeadLetter, when set, is called for each message answered
	// DeadLetter before the broker is told (to keep it aside for a human:
	// a table, another topic). An error from it makes the message Retry
	// instead.
	DeadLetter func(ctx context.Context, msg inbox.Message, d inbox.Delivery) error
	// Settled, when set, is called for each message after the broker was
	// told its disposition (d.Disposition), with the broker's error, if
	// any: for metrics and tests.
	Settled func(msg inbox.Message, d inbox.Delivery, err error)
}

// Defaults of [Options].
const (
	DefaultBatch      = 100
	DefaultMaxWait    = 100 * time.Millisecond
	DefaultRetryDelay = time.Second
)

// withDefaults returns a copy of o with its defaults, or an error naming
// the option that cannot be, or the nil handler h of the function fn.
func (o *Options) withDefaults(fn string, h BatchHandler) (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	switch {
	case h == nil:
		return c, fmt.Errorf("%w: brokers: %s: nil handler", idempotency.ErrInvalidArgument, fn)
	case c.Batch < 0:
		return c, fmt.Errorf("%w: brokers: Options.Batch %d is negative", idempotency.ErrInvalidArgument, c.Batch)
	case c.MaxWait < 0:
		return c, fmt.Errorf("%w: brokers: Options.MaxWait %v is negative", idempotency.ErrInvalidArgument, c.MaxWait)
	case c.RetryDelay < 0:
		return c, fmt.Errorf("%w: brokers: Options.RetryDelay %v is negative", idempotency.ErrInvalidArgument, c.RetryDelay)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	return c, nil
}

// handle runs h for one poll and checks that it answered every message.
func (o *Options) handle(ctx context.Context, h BatchHandler, msgs []inbox.Message) []inbox.Delivery {
	ds := h(ctx, msgs)
	if len(ds) != len(msgs) {
		err := fmt.Errorf("brokers: the BatchHandler returned %d deliveries for %d messages", len(ds), len(msgs))
		ds = make([]inbox.Delivery, len(msgs))
		for i := range ds {
			ds[i] = inbox.DeliveryOf(idempotency.OutcomeUnknown, err)
		}
	}
	return ds
}

// deadLetter calls Options.DeadLetter for a DeadLetter delivery; when it
// fails, d becomes Retry.
func (o *Options) deadLetter(ctx context.Context, msg inbox.Message, d inbox.Delivery) inbox.Delivery {
	if d.Disposition != inbox.DeadLetter || o.DeadLetter == nil {
		return d
	}
	if err := o.DeadLetter(ctx, msg, d); err != nil {
		d.Disposition, d.Err = inbox.Retry, fmt.Errorf("brokers: dead-letter: %w (delivery: %w)", err, d.Err)
	}
	return d
}

// settled calls Options.Settled.
func (o *Options) settled(msg inbox.Message, d inbox.Delivery, err error) {
	if o.Settled != nil {
		o.Settled(msg, d, err)
	}
}

// retryDelay is how long a Retry delivery waits: the store's hint for a
// delivery busy elsewhere or after a store failure (idempotency.RetryAfter,
// clamped to RetryDelay), else RetryDelay.
func (o *Options) retryDelay(d inbox.Delivery) time.Duration {
	res := idempotency.Result[struct{}]{Outcome: d.Outcome}
	if ipe, ok := errors.AsType[*idempotency.InProgressError](d.Err); ok {
		res.RetryAfter = ipe.RetryAfter
	}
	if hint := idempotency.RetryAfter(res, o.RetryDelay); hint > 0 {
		return hint
	}
	return o.RetryDelay
}
