package brokers

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/inbox"
)

// retryDelay: a delivery busy elsewhere waits the other holder's lease, a
// store failure the store's hint, both at most RetryDelay; any other
// Retry waits RetryDelay.
func TestRetryDelay(t *testing.T) {
	o := &Options{RetryDelay: 5 * time.Second}
	busy := func(left time.Duration) inbox.Delivery {
		err := &idempotency.InProgressError{RetryAfter: left}
		return inbox.Delivery{Disposition: inbox.Retry, Outcome: idempotency.OutcomeInProgress, Err: fmt.Errorf("inbox: %w", err)}
	}
	for _, tc := range []struct {
		name string
		d    inbox.Delivery
		want time.Duration
	}{
		{"busy elsewhere, lease 2s left", busy(2 * time.Second), 2 * time.Second},
		{"busy elsewhere, lease 1m left", busy(time.Minute), 5 * time.Second},
		{"store down before the handler ran", inbox.Delivery{Disposition: inbox.Retry, Outcome: idempotency.OutcomeStoreError, Err: errors.New("down")}, time.Second},
		{"the handler's transient error", inbox.Delivery{Disposition: inbox.Retry, Outcome: idempotency.OutcomeReleased, Err: errors.New("timeout")}, 5 * time.Second},
	} {
		if got := o.retryDelay(tc.d); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	short := &Options{RetryDelay: 200 * time.Millisecond}
	if got := short.retryDelay(inbox.Delivery{Outcome: idempotency.OutcomeStoreError}); got != 200*time.Millisecond {
		t.Errorf("a store failure under a RetryDelay of 200ms: %v, want 200ms", got)
	}
}

// natsFinal: a fetch error that will not go away by itself stops the
// consumer; a timeout or a passing disconnection does not.
func TestNATSFinal(t *testing.T) {
	for err, want := range map[error]bool{
		jetstream.ErrConsumerDeleted:                           true,
		fmt.Errorf("fetch: %w", jetstream.ErrConsumerNotFound): true,
		jetstream.ErrInvalidOption:                             true,
		nats.ErrConnectionClosed:                               true,
		nats.ErrTimeout:                                        false,
		jetstream.ErrNoHeartbeat:                               false,
		errors.New("something else"):                           false,
	} {
		if got := natsFinal(err); got != want {
			t.Errorf("natsFinal(%v) = %v, want %v", err, got, want)
		}
	}
}
