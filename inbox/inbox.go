// Package inbox makes a message consumer's effects exactly-once: every
// event is processed at most once per consumer, however often the broker
// delivers it. It is the receiving end of an outbox (which delivers at
// least once, each event with a stable ID) and of any broker that
// redelivers: Kafka after a rebalance, SQS after a visibility timeout,
// NATS and RabbitMQ after a missing ack.
//
// An Inbox is built on [idempotency.Do], so it works on every store and
// keeps Do's guarantees: an event is claimed atomically under a lease
// renewed while the handler runs, a concurrent redelivery is refused
// while the first is handled, a consumer that crashed mid-handling is
// taken over once its lease ends (with a greater fence and the recovery
// points it recorded), and an error marked permanent is stored, so that a
// poison message is recognised on every redelivery. On PostgreSQL the
// adapter's InboxTx records the event in the consumer's own transaction,
// together with the handler's writes.
package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlyonce/idempotency"
)

// Message identifies one delivery of an event.
type Message struct {
	// Source is where the event comes from: a producer, a topic, an
	// outbox. Event IDs need only be unique within their source.
	Source string
	// ID is the event's unique ID within Source (an outbox event ID, a
	// CloudEvents id). Not the broker's delivery or offset number, which
	// changes with every redelivery.
	ID string
	// Payload, when not nil, is fingerprinted: a later delivery of the same
	// ID with another payload (a producer that reuses IDs) gets
	// [idempotency.ErrMismatch] instead of being taken for a duplicate.
	Payload []byte
}

// Inbox processes each event once for one consumer.
type Inbox struct {
	r        *idempotency.Runner
	consumer string
}

// New returns the inbox of consumer (a stable name: two consumers of the
// same events each process every event once, in inboxes of their own) on
// r's store and options. It returns an error wrapping
// [idempotency.ErrInvalidArgument] for a nil runner or an empty consumer.
func New(r *idempotency.Runner, consumer string) (*Inbox, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: inbox: nil runner", idempotency.ErrInvalidArgument)
	case consumer == "":
		return nil, fmt.Errorf("%w: inbox: empty consumer name", idempotency.ErrInvalidArgument)
	}
	return &Inbox{r: r, consumer: consumer}, nil
}

// Runner returns the inbox's runner.
func (in *Inbox) Runner() *idempotency.Runner { return in.r }

// Request returns the idempotency request under which the inbox records
// msg: scope ("inbox", consumer, source), key the event ID. Adapters'
// transactional forms use it.
func (in *Inbox) Request(msg Message) idempotency.Request {
	req := idempotency.Request{Scope: []string{"inbox", in.consumer, msg.Source}, Key: msg.ID}
	if msg.Payload != nil {
		req.Fingerprint = idempotency.FingerprintBytes(msg.Payload)
	}
	return req
}

// Delivery is what [Inbox.Handle] reports of one delivery of an event.
type Delivery struct {
	// Outcome is how the call ended, in the library's vocabulary
	// ([idempotency.Outcome]): OutcomeCompleted when the event was
	// handled now, OutcomeReplay when it had been before, and so on.
	Outcome idempotency.Outcome
	// Duplicate reports that this consumer had processed the event before:
	// handle did not run.
	Duplicate bool
	// Disposition is what to tell the broker ([Decide]).
	Disposition Disposition
	// Err is the delivery's error: the one Handle returns, or each
	// message's for HandleBatch.
	Err error
}

// Handle runs handle for msg unless this consumer has processed msg's
// event before, and reports how the delivery went and what to tell the
// broker ([Decide] makes the Disposition from the outcome):
//
//   - handled now or before (a duplicate): Ack;
//   - an error marked [idempotency.Permanent] by handle, now or replayed on
//     a later delivery (a [*idempotency.StoredError]): the event can never
//     succeed; DeadLetter (acknowledge it and put it aside);
//   - another delivery is being handled right now
//     ([idempotency.ErrInProgress]): Retry, let the broker redeliver later;
//   - handle's transient error, after which the event is released, or a
//     store failure: Retry;
//   - an invalid source or ID ([idempotency.ErrInvalidKey]), a reused ID
//     with another payload ([idempotency.ErrMismatch]): DeadLetter, it can
//     never be recorded.
func (in *Inbox) Handle(ctx context.Context, msg Message, handle func(ctx context.Context) error) (Delivery, error) {
	if handle == nil {
		return Delivery{Disposition: DeadLetter}, fmt.Errorf("%w: inbox: nil handler", idempotency.ErrInvalidArgument)
	}
	res, err := idempotency.Do(ctx, in.r, in.Request(msg), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, handle(ctx)
	})
	return DeliveryOf(res.Outcome, err), err
}

// HandleBatch processes msgs as Handle processes each one, in one batch:
// the events of a broker's poll are claimed in one store round trip and
// recorded in one more ([idempotency.DoBatch]), instead of two round trips
// per message. handle(ctx, i) runs for msgs[i] unless this consumer has
// processed its event before, one message after another in order; it
// returns one Delivery per message, in order, with its disposition and its
// error. Messages are independent: one's failure decides its own
// disposition only; two deliveries of one event in the batch are handled
// once (the second is a duplicate). A delivery whose event another
// consumer instance is handling right now is Retry at once: the batch does
// not wait for it.
func (in *Inbox) HandleBatch(ctx context.Context, msgs []Message, handle func(ctx context.Context, i int) error) []Delivery {
	out := make([]Delivery, len(msgs))
	if handle == nil {
		err := fmt.Errorf("%w: inbox: nil handler", idempotency.ErrInvalidArgument)
		for i := range out {
			out[i] = DeliveryOf(idempotency.OutcomeUnknown, err)
		}
		return out
	}
	reqs := make([]idempotency.Request, len(msgs))
	for i, msg := range msgs {
		reqs[i] = in.Request(msg)
	}
	for i, r := range idempotency.DoBatch(ctx, in.r, reqs, func(ctx context.Context, i int) (struct{}, error) {
		return struct{}{}, handle(ctx, i)
	}) {
		out[i] = DeliveryOf(r.Outcome, r.Err)
	}
	return out
}

// DeliveryOf is the Delivery of a call that ended with outcome o and
// error err, for the transactional forms of the adapters (the PostgreSQL
// adapter's InboxTx).
func DeliveryOf(o idempotency.Outcome, err error) Delivery {
	if o == idempotency.OutcomeUnknown {
		o = idempotency.OutcomeOf(err)
	}
	return Delivery{Outcome: o, Duplicate: o == idempotency.OutcomeReplay, Disposition: Decide(o, err), Err: err}
}

// Disposition is what a consumer tells its broker about a delivery.
type Disposition uint8

// The dispositions of a delivery.
const (
	// Ack: the event is processed (now or before); acknowledge it.
	Ack Disposition = iota + 1
	// Retry: let the broker deliver the event again later (do not
	// acknowledge it, or negatively acknowledge it).
	Retry
	// DeadLetter: the event can never be processed; acknowledge it and
	// put it aside for a human.
	DeadLetter
)

// String returns the disposition's name.
func (d Disposition) String() string {
	switch d {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("Disposition(%d)", uint8(d))
}

// dispositions maps the outcome of a call to what the consumer tells the
// broker; an outcome not listed (a store failure, a lost lease, an unknown
// one) is Retry. For Completed and Replay, an error (a permanent error,
// now or replayed) is DeadLetter: the event can never succeed.
var dispositions = [...]Disposition{
	idempotency.OutcomeCompleted:       Ack,
	idempotency.OutcomeReplay:          Ack,
	idempotency.OutcomeMismatch:        DeadLetter,
	idempotency.OutcomeInvalidKey:      DeadLetter,
	idempotency.OutcomeResultNotStored: DeadLetter,
	idempotency.OutcomeCorrupt:         DeadLetter,
}

// Decide maps the outcome of a delivery, and its error, to what the
// consumer tells the broker, as [Inbox.Handle] documents.
func Decide(o idempotency.Outcome, err error) Disposition {
	if err != nil && errors.Is(err, idempotency.ErrInvalidArgument) {
		return DeadLetter // a call that can never be made
	}
	d := Retry
	if int(o) < len(dispositions) && dispositions[o] != 0 {
		d = dispositions[o]
	}
	if d == Ack && err != nil {
		return DeadLetter
	}
	return d
}
