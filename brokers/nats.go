package brokers

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/internal/edge"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ConsumeNATS pulls batches of up to o.Batch messages from the JetStream
// consumer c and hands each batch to h, until ctx is done (it then returns
// ctx's error) or the consumer fails. The event ID of a message is its
// Nats-Msg-Id header ([jetstream.MsgIDHeader]: the ID a producer sets, with
// which the stream also drops duplicate publishes within its duplicate
// window); a message without one is dead-lettered (ErrInvalidKey).
//
// Each message is then acknowledged (Ack), negatively acknowledged with a
// delay (Retry: JetStream delivers it again after [Options.RetryDelay], or
// after the time left on the lease of the delivery that holds it) or
// terminated (DeadLetter, after [Options.DeadLetter]): JetStream delivers a
// terminated message no more. A message neither acknowledged nor
// negatively acknowledged, because the consumer died or its ack was lost,
// is delivered again after the consumer's AckWait: the inbox then replays
// it if its batch completed, reports it in progress while the lease of the
// dead consumer lasts, and lets it be taken over after that.
//
// Give c an AckWait longer than a batch takes to handle, and a MaxDeliver
// of -1 (unlimited) or large enough for the retries you allow.
func ConsumeNATS(ctx context.Context, c jetstream.Consumer, h BatchHandler, opts *Options) error {
	o, err := opts.withDefaults("ConsumeNATS", h)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("%w: brokers: ConsumeNATS: nil consumer", idempotency.ErrInvalidArgument)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		fctx, cancel := context.WithTimeout(ctx, o.MaxWait)
		batch, err := c.Fetch(o.Batch, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if natsFinal(err) {
				return fmt.Errorf("brokers: NATS fetch: %w", err)
			}
			// Disconnected (the client reconnects by itself), a leader
			// election: try again.
			if err := edge.Sleep(ctx, o.RetryDelay); err != nil {
				return err
			}
			continue
		}
		var got []jetstream.Msg
		for m := range batch.Messages() {
			got = append(got, m)
		}
		cancel()
		if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, jetstream.ErrNoMessages) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if natsFinal(err) {
				return fmt.Errorf("brokers: NATS fetch: %w", err)
			}
		}
		if len(got) == 0 {
			continue
		}
		msgs := make([]inbox.Message, len(got))
		for i, m := range got {
			msgs[i] = inbox.Message{Source: o.Source, ID: m.Headers().Get(jetstream.MsgIDHeader), Payload: m.Data()}
			if msgs[i].Source == "" {
				if md, err := m.Metadata(); err == nil {
					msgs[i].Source = md.Stream
				}
			}
		}
		ds := o.handle(ctx, h, msgs)
		for i, m := range got {
			d := o.deadLetter(ctx, msgs[i], ds[i])
			var err error
			switch d.Disposition {
			case inbox.Ack:
				err = m.Ack()
			case inbox.DeadLetter:
				err = m.Term()
			default:
				err = m.NakWithDelay(o.retryDelay(d))
			}
			o.settled(msgs[i], d, err)
		}
	}
}

// natsFinal reports whether a fetch's error will not go away by itself.
func natsFinal(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrInvalidOption) || errors.Is(err, nats.ErrConnectionClosed)
}
