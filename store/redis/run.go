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
// connection to the node that owns it, as WAIT and batches need.
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

// A scriptCall is one script to run on keys (which share a hash tag; the
// first one routes the call) with args. A write is followed by a WAIT for
// replicas when they are required.
type scriptCall struct {
	sc    *goredis.Script
	keys  []string
	args  []any
	write bool
}

// call runs c with [Store.run].
func (s *Store) call(ctx context.Context, c scriptCall) (ran, error) {
	return do(s, ctx, c.keys[0], func(ctx context.Context) (ran, error) {
		return s.runNow(ctx, c.sc, c.keys, c.write, c.args)
	})
}

// run runs sc on keys (which share a hash tag; the first one routes the
// call), through [do], so that it ends when ctx does or when a dial for it
// fails. Scripts go through EVALSHA, and through EVAL after a
// NOSCRIPT reply (a server restarted or flushed its script cache): both
// are safe to repeat, as every operation is. When write is set and
// replicas are required, the script and a WAIT are pipelined on one
// connection to the key's node, and the WAIT's reply is returned.
func (s *Store) run(ctx context.Context, sc *goredis.Script, keys []string, write bool, args ...any) (any, *goredis.IntCmd, error) {
	r, err := s.call(ctx, scriptCall{sc: sc, keys: keys, args: args, write: write})
	return r.v, r.wait, err
}

// ran is what runNow returns: the script's reply, and the WAIT pipelined
// after it, if any.
type ran struct {
	v    any
	wait *goredis.IntCmd
}

// runNow runs one script call: through the client's own EVALSHA-then-EVAL
// ([goredis.Script.Run]), or, when it is a write and replicas are
// required, as a pipeline of one on its node, followed by the WAIT.
func (s *Store) runNow(ctx context.Context, sc *goredis.Script, keys []string, write bool, args []any) (ran, error) {
	if !write || s.replicas == 0 {
		v, err := sc.Run(ctx, s.client, keys, args...).Result()
		return ran{v: v}, err
	}
	node, err := s.node(ctx, keys[0])
	if err != nil {
		return ran{}, err
	}
	r := s.pipelineNow(ctx, node, []scriptCall{{sc: sc, keys: keys, args: args, write: write}})[0]
	return r.ran, r.err
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
