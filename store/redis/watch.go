package redis

import (
	"context"
	"time"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

// subscriber is a client with sharded pub/sub (Redis 7.0 or later).
type subscriber interface {
	SSubscribe(ctx context.Context, channels ...string) *goredis.PubSub
}

// subscribeTimeout bounds the wait for a subscription's confirmation when
// the context has no deadline.
const subscribeTimeout = 5 * time.Second

// Watch implements [idempotency.Watcher]: it returns when the record under
// key completes, is released or is not STARTED any more, or when ctx is
// done (returning ctx's error). It needs [Options.Notify]; without it, it
// returns an error at once and callers poll.
//
// Watch subscribes to the record's shard channel (SSUBSCRIBE on a
// connection of its own, on the node that owns the key), then reads the
// record's state: a record that is already not STARTED returns at once, so
// a change between the caller's claim and the subscription is not missed.
// Completion and release publish from inside their scripts; a record that
// expires publishes nothing, so callers still poll at the lease's
// retry-after hint.
func (s *Store) Watch(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.notify != "1" {
		return errNoNotify
	}
	k := s.Key(key)
	ps := s.client.(subscriber).SSubscribe(ctx, k)
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, subscribeTimeout); err != nil {
		return s.wrap("watch", err)
	}
	state, err := do(s, ctx, k, func(ctx context.Context) (string, error) {
		return stateScript.Run(ctx, s.client, []string{k}).Text()
	})
	if err != nil {
		return s.wrap("watch", err)
	}
	if state != string(idempotency.StateStarted) {
		return nil
	}
	select {
	case <-ps.Channel():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
