package brokers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	amqp "github.com/rabbitmq/amqp091-go"
)

// ConsumeRabbitMQ consumes queue on the channel ch in batches of up to
// o.Batch deliveries (the channel's prefetch, set here with basic.qos) and
// hands each batch to h, until ctx is done (it then returns ctx's error)
// or the channel closes. The event ID of a message is its message-id
// property (amqp.Publishing.MessageId); a message without one is
// dead-lettered (ErrInvalidKey). A batch is what has arrived once the first
// delivery is there and o.MaxWait has passed, or o.Batch deliveries.
//
// Each message is then acknowledged (Ack), negatively acknowledged with
// requeue (Retry: RabbitMQ delivers it again at once, to this consumer or
// another; it has no delay) or negatively acknowledged without requeue
// (DeadLetter, after [Options.DeadLetter]: the queue's dead-letter
// exchange gets it, if the queue has one, else RabbitMQ drops it). The
// deliveries a consumer leaves unacknowledged when it dies, or when its
// connection drops, go back to the queue: the inbox then replays those
// whose batch completed, reports in progress those whose lease still runs
// (requeued again) and lets the rest be taken over once their lease ends.
//
// Where many deliveries are Retry, as while a dead consumer's leases run,
// RabbitMQ sends them straight back: a requeue storm, whose rate the
// prefetch bounds. Each round costs one batch of store calls (two round
// trips with a batching store), not a call per message.
func ConsumeRabbitMQ(ctx context.Context, ch *amqp.Channel, queue string, h BatchHandler, opts *Options) error {
	o, err := opts.withDefaults("ConsumeRabbitMQ", h)
	if err != nil {
		return err
	}
	switch {
	case ch == nil:
		return fmt.Errorf("%w: brokers: ConsumeRabbitMQ: nil channel", idempotency.ErrInvalidArgument)
	case queue == "":
		// basic.consume would take the channel's last declared queue.
		return fmt.Errorf("%w: brokers: ConsumeRabbitMQ: empty queue name", idempotency.ErrInvalidArgument)
	}
	if o.Source == "" {
		o.Source = queue
	}
	if err := ch.Qos(o.Batch, 0, false); err != nil {
		return fmt.Errorf("brokers: RabbitMQ basic.qos: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deliveries, err := ch.ConsumeWithContext(cctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("brokers: RabbitMQ basic.consume: %w", err)
	}
	for {
		got, err := gatherRabbitMQ(ctx, deliveries, &o)
		if err != nil {
			return err
		}
		msgs := make([]inbox.Message, len(got))
		for i, d := range got {
			msgs[i] = inbox.Message{Source: o.Source, ID: d.MessageId, Payload: d.Body}
		}
		ds := o.handle(ctx, h, msgs)
		for i, m := range got {
			d := o.deadLetter(ctx, msgs[i], ds[i])
			var err error
			switch d.Disposition {
			case inbox.Ack:
				err = m.Ack(false)
			case inbox.DeadLetter:
				err = m.Nack(false, false)
			default:
				err = m.Nack(false, true)
			}
			o.settled(msgs[i], d, err)
		}
	}
}

// errChannelClosed ends ConsumeRabbitMQ when the deliveries stop.
var errChannelClosed = errors.New("brokers: RabbitMQ: the channel closed")

// gatherRabbitMQ waits for a delivery, then takes more until o.Batch or
// o.MaxWait.
func gatherRabbitMQ(ctx context.Context, deliveries <-chan amqp.Delivery, o *Options) ([]amqp.Delivery, error) {
	var got []amqp.Delivery
	var full <-chan time.Time // nil until the first delivery, which may take as long as it takes
	for len(got) < o.Batch {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				// The deliveries got so far go back to the queue: acks
				// cannot reach it any more.
				return nil, errChannelClosed
			}
			got = append(got, d)
			if full == nil {
				t := time.NewTimer(o.MaxWait)
				defer t.Stop()
				full = t.C
			}
		case <-full:
			return got, nil
		}
	}
	return got, nil
}
