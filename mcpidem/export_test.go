package mcpidem

import (
	"context"
	"time"
)

// WithSleep replaces the client middleware's waits between attempts, for
// tests that record them.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.Sleep = sleep })
}

// WithJitter replaces the client middleware's random draw of a wait in
// [0, d].
func WithJitter(jitter func(d time.Duration) time.Duration) ClientOption {
	return clientOptionFunc(func(c *clientConfig) { c.backoff.Jitter = jitter })
}
