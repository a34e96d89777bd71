package queue

import "time"

// WithClock sets the queue's clock (of backoffs, marks and deadlines).
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) { c.now = now })
}

// WithMargin replaces ExpiryMargin.
func WithMargin(d time.Duration) Option {
	return optionFunc(func(c *config) { c.margin = d })
}
