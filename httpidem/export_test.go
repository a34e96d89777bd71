package httpidem

import (
	"context"
	"time"
)

// WithClientClock replaces the Transport's clock, its sleep and its jitter
// (nil keeps each), so that tests measure waits without sleeping.
func WithClientClock(now func() time.Time, sleep func(ctx context.Context, d time.Duration) error, jitter func(d time.Duration) time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) {
		c.backoff.Now, c.backoff.Sleep, c.backoff.Jitter = now, sleep, jitter
	})
}
