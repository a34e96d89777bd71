package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
)

// pipeliner sends a pipeline over one connection to one node.
type pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// canWait reports whether the store can reach, for any key, a single
// connection to the node that owns it, as WAIT needs.
func canWait(c Client) bool {
	switch c.(type) {
	case *goredis.ClusterClient, *goredis.Ring:
		return true
	case *goredis.Client, *goredis.Conn:
		return true
	}
	return false
}

// node returns the client that owns key: for Cluster the master of the
// key's slot, for Ring the key's shard, otherwise the client itself.
func (s *Store) node(ctx context.Context, key string) (pipeliner, error) {
	switch c := s.client.(type) {
	case *goredis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *goredis.Ring:
		return c.GetShardClientForKey(key)
	case *goredis.Client:
		return c, nil
	case *goredis.Conn:
		return c, nil
	}
	return nil, fmt.Errorf("redis: cannot WAIT with a %T", s.client)
}

// run runs sc on keys (which share a hash tag; the first one routes the
// call), through [do], so that it ends when ctx does or when a dial for it
// fails. Scripts go through EVALSHA, and through EVAL after a
// NOSCRIPT reply (a server restarted or flushed its script cache): both
// are safe to repeat, as every operation is. When write is set and
// replicas are required, the script and a WAIT are pipelined on one
// connection to the key's node, and the WAIT's reply is returned.
func (s *Store) run(ctx context.Context, sc *goredis.Script, keys []string, write bool, args ...any) (any, *goredis.IntCmd, error) {
	r, err := do(s, ctx, keys[0], func(ctx context.Context) (ran, error) {
		return s.runNow(ctx, sc, keys, write, args)
	})
	return r.v, r.wait, err
}

// ran is what runNow returns.
type ran struct {
	v    any
	wait *goredis.IntCmd
}

func (s *Store) runNow(ctx context.Context, sc *goredis.Script, keys []string, write bool, args []any) (ran, error) {
	if !write || s.replicas == 0 {
		v, err := sc.Run(ctx, s.client, keys, args...).Result()
		return ran{v: v}, err
	}
	node, err := s.node(ctx, keys[0])
	if err != nil {
		return ran{}, err
	}
	for attempt := 0; ; attempt++ {
		pipe := node.Pipeline()
		var cmd *goredis.Cmd
		if attempt == 0 {
			cmd = sc.EvalSha(ctx, pipe, keys, args...)
		} else {
			cmd = sc.Eval(ctx, pipe, keys, args...)
		}
		wait := goredis.NewIntCmd(ctx, "wait", s.replicas, s.replicaTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx) // errors are read from each command
		if attempt == 0 && goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			continue
		}
		v, err := cmd.Result()
		return ran{v: v, wait: wait}, err
	}
}

// checkWait judges the reply of a WAIT pipelined after a write.
func (s *Store) checkWait(wait *goredis.IntCmd) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Result()
	if err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	if n < int64(s.replicas) {
		return fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, s.replicas, s.replicaTimeout)
	}
	return nil
}
