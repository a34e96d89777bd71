package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlyonce/idempotency"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A batch nests each item's own transaction, the one its single call
// sends first, in one transaction of the batch (etcd 3.3 and later run
// nested transactions): each item's compare decides that item's branch
// only, so the items are decided apart, each atomically, in one round
// trip. etcd bounds a transaction by its operations (--max-txn-ops, 128
// by default: the items count at the top, and an item's own transaction
// must fit in what they leave, up to 3 operations deep for a release) and
// by its size (--max-request-bytes, 1.5 MiB by default): a batch is split
// into transactions of at most maxBatchItems items and about
// maxBatchBytes bytes, sent at once. A server with lower limits refuses a
// transaction before applying any of it; the store then splits it in two
// and sends the halves, and keeps half of what was refused as its limit
// for the batches after.

// maxBatchItems is the most items of one batch transaction with etcd's
// default --max-txn-ops of 128: 125 items leave 3 operations for each
// item's own transaction.
const maxBatchItems = 125

// maxBatchBytes is the size in bytes up to which a batch transaction
// takes items, at least: below etcd's default --max-request-bytes of 1.5
// MiB. A store whose MaxValueSize is larger takes up to MaxValueSize (its
// option says the server takes that much).
const maxBatchBytes = 1 << 20

var _ idempotency.Batcher = (*Store)(nil)

// ClaimBatch implements [idempotency.Batcher]. The first transaction of
// each claim (create the record if its key is absent, else read it) is
// nested in one transaction of the batch, with one pair of leases for
// every claim of the same lease and grace, so that a batch of fresh keys,
// replays and mismatches is one round trip (two when a lease must be
// granted first), split as the package's limits say. An item whose read
// record is STARTED with the same fingerprint (in progress, a repeat by
// its holder, or a takeover) goes on as [Store.Claim] goes on, with its
// own round trips, sent at once for all such items. Each item gets what
// Claim would answer: a request Claim refuses gets that error before
// anything is sent, a transaction that fails fails its own items. An item
// whose key an earlier item has (which etcd refuses in one transaction) is
// claimed after the batch, on its own, as a Claim made after the earlier
// one.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, []error) {
	results, errs := make([]idempotency.ClaimResult, len(reqs)), make([]error, len(reqs))
	if err := ctx.Err(); err != nil {
		fill(errs, err)
		return results, errs
	}
	start := time.Now()
	type leasePair struct{ live, life clientv3.LeaseID }
	type leaseErr struct {
		leasePair
		err error
	}
	leases := make(map[[2]time.Duration]leaseErr, 1)
	var items []batchItem
	pairs := make([]leasePair, len(reqs))
	seen, later := make(keySet, len(reqs)), []int(nil)
	for i, r := range reqs {
		if err := idempotency.ValidateClaim("etcd", r); err != nil {
			errs[i] = err
			continue
		}
		if seen.repeat(r.Key) {
			later = append(later, i)
			continue
		}
		need := [2]time.Duration{r.Lease, r.Lease + ceilMillis(r.Grace)}
		l, ok := leases[need]
		if !ok {
			l.live, l.life, l.err = s.twoLeases(ctx, need[0], need[1], start)
			leases[need] = l
		}
		if l.err != nil {
			errs[i] = s.wrap(ctx, "claim", l.err)
			continue
		}
		pairs[i] = l.leasePair
		cmp, then, orElse := claimTxn(s.keys(r.Key), r, l.live, l.life)
		items = append(items, newBatchItem(i, clientv3.OpTxn([]clientv3.Cmp{cmp}, then, []clientv3.Op{orElse})))
	}
	var wg sync.WaitGroup
	s.commitBatch(ctx, &wg, items, func(i int, resp *clientv3.TxnResponse, err error) {
		r := reqs[i]
		switch {
		case isLeaseNotFound(err):
			// The batch's transaction wrote nothing: each claim again
			// on its own, with leases the server has.
			s.leases.forget(pairs[i].live, pairs[i].life)
			wg.Go(func() { results[i], errs[i] = s.claim(ctx, r, start, nil) })
			return
		case err != nil:
			errs[i] = s.wrap(ctx, "claim", err)
			return
		}
		first := &firstTry{resp: resp, live: pairs[i].live, life: pairs[i].life, settle: true}
		results[i], errs[i] = s.claim(ctx, r, start, first)
		if errors.Is(errs[i], errMore) {
			first.settle = false
			wg.Go(func() { results[i], errs[i] = s.claim(ctx, r, start, first) })
		}
	})
	wg.Wait()
	for _, i := range later {
		results[i], errs[i] = s.claim(ctx, reqs[i], time.Now(), nil)
	}
	return results, errs
}

// FinishBatch implements [idempotency.Batcher]. Each completion's
// transaction (rewrite the record as COMPLETED if it is unchanged since
// the store last saw it under the item's token, else read it) and each
// release's are nested in one transaction of the batch, split as the
// package's limits say: one round trip for the items the store saw
// claimed (their own claims, [Store.ClaimBatch]'s or a renewal's), and
// for every item whose record changed meanwhile, or that the store never
// saw, the round trips its own [Store.Complete] takes, sent at once. Each
// item is applied or refused on its own: ErrLeaseLost for a token that no
// longer holds its record, ErrTooLarge for a result above MaxValueSize
// (sent to nobody), a transaction's error for its own items. An item
// whose key an earlier item has is completed or released after the batch,
// on its own.
func (s *Store) FinishBatch(ctx context.Context, items []idempotency.Finish) []error {
	errs := make([]error, len(items))
	if err := ctx.Err(); err != nil {
		fill(errs, err)
		return errs
	}
	start := time.Now()
	var wg sync.WaitGroup
	var batch []batchItem
	type completion struct {
		k      recordKeys
		st     holderState
		ops    holderOps
		leases []clientv3.LeaseID
	}
	completions := make([]completion, len(items))
	seen, later := make(keySet, len(items)), []int(nil)
	for i, f := range items {
		if seen.repeat(f.Key) {
			later = append(later, i)
			continue
		}
		k := s.keys(f.Key)
		if f.Release {
			cmps, then, orElse := releaseTxn(k, f.Token)
			batch = append(batch, newBatchItem(i, clientv3.OpTxn(cmps, then, []clientv3.Op{orElse})))
			continue
		}
		if err := s.checkCompletion(f.Result, f.Retention); err != nil {
			errs[i] = err
			continue
		}
		c := completion{k: k, st: s.holders.get(f.Key, f.Token), ops: s.completeOps(ctx, k, f.Token, f.Result, f.Retention, start)}
		completions[i] = c
		if !c.st.known {
			wg.Go(func() { errs[i] = s.Complete(ctx, f.Key, f.Token, f.Result, f.Retention) })
			continue
		}
		then, leases, err := c.ops(c.st)
		if err != nil {
			errs[i] = s.completed(ctx, f.Key, f.Token, err)
			continue
		}
		completions[i].leases = leases
		cmp, orElse := holderTxn(k, c.st)
		batch = append(batch, newBatchItem(i, clientv3.OpTxn([]clientv3.Cmp{cmp}, then, orElse)))
	}
	s.commitBatch(ctx, &wg, batch, func(i int, resp *clientv3.TxnResponse, err error) {
		f := items[i]
		if f.Release {
			if err != nil {
				errs[i] = s.wrap(ctx, "release", err)
			} else {
				errs[i] = s.released(f.Key, f.Token, resp)
			}
			return
		}
		c := completions[i]
		switch {
		case isLeaseNotFound(err):
			s.leases.forget(c.leases...)
			resp = nil // the batch wrote nothing: the item's own write
		case err != nil:
			errs[i] = s.completed(ctx, f.Key, f.Token, err)
			return
		case resp.Succeeded:
			errs[i] = s.completed(ctx, f.Key, f.Token, nil)
			return
		}
		wg.Go(func() {
			_, _, _, err := s.holderWriteFrom(ctx, "complete", f.Key, f.Token, c.k, c.st, c.ops, resp)
			errs[i] = s.completed(ctx, f.Key, f.Token, err)
		})
	})
	wg.Wait()
	for _, i := range later {
		if f := items[i]; f.Release {
			errs[i] = s.Release(ctx, f.Key, f.Token)
		} else {
			errs[i] = s.Complete(ctx, f.Key, f.Token, f.Result, f.Retention)
		}
	}
	return errs
}

// A keySet holds the keys of a batch's items. etcd refuses a transaction
// that writes a key twice, even in two nested transactions: an item whose
// key an earlier item of the batch has is not sent with the batch, but
// after it, on its own, as a call made after the earlier item's would be
// ([idempotency.DoBatch] sends each key once, so this is the rare path).
type keySet map[string]struct{}

// repeat reports whether k is in the set, and adds it.
func (ks keySet) repeat(k string) bool {
	if _, ok := ks[k]; ok {
		return true
	}
	ks[k] = struct{}{}
	return false
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// A batchItem is item i's own transaction (an OpTxn) in a batch, and
// about the bytes it takes in a request.
type batchItem struct {
	i    int
	op   clientv3.Op
	size int
}

func newBatchItem(i int, op clientv3.Op) batchItem {
	return batchItem{i: i, op: op, size: opSize(op)}
}

// commitBatch commits items, each nested in a transaction of the batch,
// in as few transactions as the limits take (see maxBatchItems), sent at
// once; done gets each item's answer: its own transaction's response,
// with the header of the batch's, or the error of the batch's
// transaction. done runs on the transaction's goroutine; it may add to
// wg, which commitBatch adds its transactions to, and the caller waits
// for.
func (s *Store) commitBatch(ctx context.Context, wg *sync.WaitGroup, items []batchItem, done func(i int, resp *clientv3.TxnResponse, err error)) {
	most, budget := s.batchLimits()
	var chunks [][]batchItem
	for len(items) > 0 {
		n, size := 0, 0
		for n < len(items) && n < most {
			size += items[n].size
			if n > 0 && size > budget {
				break
			}
			n++
		}
		chunks = append(chunks, items[:n])
		items = items[n:]
	}
	for j, c := range chunks {
		if j == len(chunks)-1 {
			s.commitChunk(ctx, wg, c, done)
			break
		}
		wg.Go(func() { s.commitChunk(ctx, wg, c, done) })
	}
}

// commitChunk commits items in one transaction. One the server (or the
// client, before sending) refuses as too large or of too many operations
// is split in two, and the store keeps half of it as its limit.
func (s *Store) commitChunk(ctx context.Context, wg *sync.WaitGroup, items []batchItem, done func(i int, resp *clientv3.TxnResponse, err error)) {
	ops := make([]clientv3.Op, len(items))
	size := 0
	for j, it := range items {
		ops[j] = it.op
		size += it.size
	}
	resp, err := s.client.Txn(ctx).Then(ops...).Commit()
	if err != nil && len(items) > 1 && ctx.Err() == nil {
		split := true
		switch {
		case errors.Is(err, rpctypes.ErrTooManyOps):
			lower(&s.batchItems, int64(len(items)/2))
		case errors.Is(err, rpctypes.ErrRequestTooLarge) || tooLargeToSend(err):
			lower(&s.batchBytes, int64(size/2))
		default:
			split = false
		}
		if split {
			half := len(items) / 2
			wg.Go(func() { s.commitChunk(ctx, wg, items[:half], done) })
			s.commitChunk(ctx, wg, items[half:], done)
			return
		}
	}
	for j, it := range items {
		if err != nil {
			done(it.i, nil, err)
			continue
		}
		n := resp.Responses[j].GetResponseTxn()
		done(it.i, &clientv3.TxnResponse{Header: resp.Header, Succeeded: n.Succeeded, Responses: n.Responses}, nil)
	}
}

// batchLimits returns the most items, and about the most bytes, of one
// batch transaction: maxBatchItems and maxBatchBytes (or MaxValueSize if
// larger), or half of what a server refused.
func (s *Store) batchLimits() (items, bytes int) {
	items, bytes = maxBatchItems, max(maxBatchBytes, s.maxValue)
	if n := s.batchItems.Load(); n > 0 {
		items = int(n)
	}
	if n := s.batchBytes.Load(); n > 0 {
		bytes = int(n)
	}
	return items, bytes
}

// lower makes n the limit a holds, if it is less than a's (0: none yet).
func lower(a *atomic.Int64, n int64) {
	for n >= 1 {
		old := a.Load()
		if old != 0 && old <= n || a.CompareAndSwap(old, n) {
			return
		}
	}
}

// opSize approximates the bytes op takes in a request: its keys, values
// and compares, and a little for each.
func opSize(op clientv3.Op) int {
	const each = 16
	if !op.IsTxn() {
		return each + len(op.KeyBytes()) + len(op.RangeBytes()) + len(op.ValueBytes())
	}
	cmps, then, orElse := op.Txn()
	n := each
	for _, c := range cmps {
		n += each + len(c.Key) + len(c.RangeEnd) + len(c.ValueBytes())
	}
	for _, o := range then {
		n += opSize(o)
	}
	for _, o := range orElse {
		n += opSize(o)
	}
	return n
}
