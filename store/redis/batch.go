package redis

import (
	"context"
	"sync"

	"github.com/exactlyonce/idempotency"
	goredis "github.com/redis/go-redis/v9"
)

var _ idempotency.Batcher = (*Store)(nil)

// ClaimBatch implements [idempotency.Batcher]: each request's claim script,
// the one [Store.Claim] runs, in one pipeline per node that owns some of
// the requests' keys (one pipeline on a single server; on a Cluster or a
// Ring, the nodes' pipelines are sent at once), so a batch costs one round
// trip whatever its size and however many slots it spans. Each item is
// decided by its own script, atomically, as its own Claim would be, and
// answered on its own: a request Claim would refuse gets that error, a
// node that fails fails its items only. With [Options.Replicas], each
// node's pipeline ends with a WAIT, which covers every claim before it on
// that connection.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	results, errs := make([]idempotency.ClaimResult, len(reqs)), make([]error, len(reqs))
	calls, at := make([]scriptCall, 0, len(reqs)), make([]int, 0, len(reqs))
	if err := ctx.Err(); err != nil {
		fill(errs, err)
		return results, errs
	}
	for i, r := range reqs {
		c, err := s.claimCall(r)
		if err != nil {
			errs[i] = err
			continue
		}
		calls, at = append(calls, c), append(at, i)
	}
	for j, r := range s.runBatch(ctx, calls) {
		results[at[j]], errs[at[j]] = s.claimDone(r.ran, r.err)
	}
	return results, errs
}

// FinishBatch implements [idempotency.Batcher]: each item's completion or
// release script, the one [Store.Complete] or [Store.Release] runs, in one
// pipeline per node, as [Store.ClaimBatch] sends claims. Each item is
// applied or refused on its own (ErrLeaseLost for a token that no longer
// holds its record, ErrTooLarge for a result above MaxValueSize, sent to
// nobody); with [Options.Notify] each publishes on its record's shard
// channel from its script, and with [Options.Replicas] a node's pipeline
// that completes a record ends with a WAIT.
func (s *Store) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	errs := make([]error, len(items))
	calls, at := make([]scriptCall, 0, len(items)), make([]int, 0, len(items))
	if err := ctx.Err(); err != nil {
		fill(errs, err)
		return errs
	}
	for i, f := range items {
		var c scriptCall
		var err error
		if f.Release {
			c, err = s.releaseCall(f.Key, f.Token)
		} else {
			c, err = s.completeCall(f.Key, f.Token, f.Result, f.Retention)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		calls, at = append(calls, c), append(at, i)
	}
	for j, r := range s.runBatch(ctx, calls) {
		f := items[at[j]]
		if f.Release {
			errs[at[j]] = s.done("release", r.v, r.err)
		} else {
			errs[at[j]] = s.completeDone(millis(f.Retention), r.ran, r.err)
		}
	}
	return errs
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// reply is one call's answer in a batch.
type reply struct {
	ran
	err error
}

// runBatch runs calls, on keys of any slots, and returns each one's reply,
// in order. The calls are grouped by the node that owns their key (the
// master of its slot on a Cluster, its shard on a Ring; a single server
// is one node), and each node gets one pipeline, all sent at once, each
// bounded as [do] bounds one call (it ends with ctx, and at once when a
// dial to its node fails); a node that cannot be reached fails its own
// calls only. On a client of another type, whose nodes the store cannot
// reach, the calls are run one after another.
func (s *Store) runBatch(ctx context.Context, calls []scriptCall) []reply {
	out := make([]reply, len(calls))
	if !canWait(s.client) {
		for i, c := range calls {
			out[i].ran, out[i].err = s.call(ctx, c)
		}
		return out
	}
	type group struct {
		node  pipeliner
		calls []scriptCall
		at    []int
	}
	var groups []*group
	byNode := make(map[pipeliner]*group, 1)
	for i, c := range calls {
		n, err := s.node(ctx, c.keys[0])
		if err != nil {
			out[i].err = err
			continue
		}
		g := byNode[n]
		if g == nil {
			g = &group{node: n}
			byNode[n] = g
			groups = append(groups, g)
		}
		g.calls, g.at = append(g.calls, c), append(g.at, i)
	}
	send := func(g *group) {
		rs, err := do(s, ctx, g.calls[0].keys[0], func(ctx context.Context) ([]reply, error) {
			return s.pipelineNow(ctx, g.node, g.calls), nil
		})
		for j, i := range g.at {
			if err != nil {
				out[i].err = err
			} else {
				out[i] = rs[j]
			}
		}
	}
	var wg sync.WaitGroup
	for j, g := range groups {
		if j == len(groups)-1 {
			send(g) // the last on this goroutine
			break
		}
		wg.Add(1)
		spawn(func() {
			defer wg.Done()
			send(g)
		})
	}
	wg.Wait()
	return out
}

// pipelineNow runs calls, whose keys node owns, in one pipeline, followed
// by a WAIT for replicas when one of them is a write and replicas are
// required, and returns each one's reply. Scripts go through EVALSHA; the
// calls answered NOSCRIPT (a server restarted or flushed its script cache:
// they did not run) are sent again with EVAL, which loads the script, in a
// second pipeline with its own WAIT. A call whose slot has moved to
// another node (MOVED or ASK: it did not run either) is run again through
// the client, which follows the redirection, unless it must wait for
// replicas on its node; the client is told to reload the slots' owners.
func (s *Store) pipelineNow(ctx context.Context, node pipeliner, calls []scriptCall) []reply {
	out := make([]reply, len(calls))
	todo := make([]int, len(calls))
	for i := range todo {
		todo[i] = i
	}
	for attempt := 0; len(todo) > 0; attempt++ {
		pipe := node.Pipeline()
		cmds := make([]*goredis.Cmd, len(todo))
		write := false
		for j, i := range todo {
			c := calls[i]
			if attempt == 0 {
				cmds[j] = c.sc.EvalSha(ctx, pipe, c.keys, c.args...)
			} else {
				cmds[j] = c.sc.Eval(ctx, pipe, c.keys, c.args...)
			}
			write = write || c.write
		}
		var wait *goredis.IntCmd
		if write && s.replicas > 0 {
			wait = goredis.NewIntCmd(ctx, "wait", s.replicas, s.replicaTimeout.Milliseconds())
			_ = pipe.Process(ctx, wait)
		}
		_, _ = pipe.Exec(ctx) // errors are read from each command
		var again []int
		for j, i := range todo {
			err := cmds[j].Err()
			if attempt == 0 && goredis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, i)
				continue
			}
			out[i].v, out[i].err = cmds[j].Val(), err
			if calls[i].write {
				out[i].wait = wait
			}
		}
		todo = again
	}
	for i, r := range out {
		if !goredis.HasErrorPrefix(r.err, "MOVED") && !goredis.HasErrorPrefix(r.err, "ASK") {
			continue
		}
		if cc, ok := s.client.(*goredis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		// A write waiting for replicas needs the key's node itself: it
		// fails this time, as its own call would, and the core repeats
		// it once the client knows the new owner.
		if c := calls[i]; !c.write || s.replicas == 0 {
			out[i].ran = ran{}
			out[i].v, out[i].err = c.sc.Run(ctx, s.client, c.keys, c.args...).Result()
		}
	}
	return out
}
