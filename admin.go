package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The operator's view of a runner's records: what a support engineer needs
// when "a customer's retry keeps getting 409" (inspect the key, see its
// lease and attempt, purge it or let it be taken over), and what a job
// needs to keep storage bounded (sweep). The store must implement
// [Inspector] (and [Sweeper] for Sweep); otherwise these return an error
// matching errors.ErrUnsupported.

// inspector returns the runner's store as an Inspector.
func (r *Runner) inspector(op string) (Inspector, error) {
	if in := r.caps.Inspector; in != nil {
		return in, nil
	}
	return nil, fmt.Errorf("idempotency: %s: the store (%T) has no Inspector (Capabilities): %w", op, r.store, errors.ErrUnsupported)
}

// Inspect returns the record of req's scope and key (its fingerprint is
// not used). The result bytes are left out unless withResult is set:
// results may hold personal data that an operator rarely needs to see;
// [DescribeResult] tells what they are. It returns an error wrapping
// [ErrInvalidKey] for an invalid key, [ErrNotFound] when there is no live
// record, and a [*StoreError] when the store fails.
func (r *Runner) Inspect(ctx context.Context, req Request, withResult bool) (RecordInfo, error) {
	key, err := r.adminKey(req)
	if err != nil {
		return RecordInfo{}, err
	}
	return r.InspectStorageKey(ctx, key, withResult)
}

// InspectStorageKey is [Runner.Inspect] for a storage key, as listed by
// [Runner.Stuck].
func (r *Runner) InspectStorageKey(ctx context.Context, key string, withResult bool) (RecordInfo, error) {
	in, err := r.inspector("inspect")
	if err != nil {
		return RecordInfo{}, err
	}
	var info RecordInfo
	err = r.retry(ctx, func(ctx context.Context) error {
		var err error
		info, err = in.Inspect(ctx, key)
		return err
	})
	switch {
	case errors.Is(err, ErrNotFound):
		return RecordInfo{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	case err != nil:
		return RecordInfo{}, &StoreError{Op: "inspect", Err: err}
	}
	info.ResultSize = len(info.Result)
	if !withResult {
		info.Result = nil
	}
	return info, nil
}

// Purge deletes the record of req's scope and key, whatever its state, and
// reports an OutcomePurged event to the observer. The next call with the key
// runs fn afresh (with a greater fence); a holder still running gets
// [ErrLeaseLost] when it next writes, and a retry that arrives meanwhile
// may run fn while it does: purge a STARTED record only when its holder is
// known to be gone, or let its lease run out and be taken over instead.
// Purging an absent record succeeds.
func (r *Runner) Purge(ctx context.Context, req Request) error {
	key, err := r.adminKey(req)
	if err != nil {
		return err
	}
	in, err := r.inspector("purge")
	if err != nil {
		return err
	}
	if r.cache != nil {
		r.cache.drop(key)
	}
	start := time.Now()
	err = r.retry(ctx, func(ctx context.Context) error { return in.Purge(ctx, key) })
	if r.cache != nil {
		r.cache.drop(key) // also a replay cached while the purge ran
	}
	if err != nil {
		r.observe(ctx, Event{Outcome: OutcomeStoreError, Key: key, Scope: req.Scope, Duration: time.Since(start), Err: err})
		return &StoreError{Op: "purge", Err: err}
	}
	r.observe(ctx, Event{Outcome: OutcomePurged, Key: key, Scope: req.Scope, Duration: time.Since(start)})
	return nil
}

// Stuck lists up to limit records whose holder's lease ended without a
// completion or a release, and which nobody has taken over: a crashed
// holder whose client did not retry. Pass the returned cursor to get the
// next page; it is "" after the last. [Reconcile] resolves them. Results
// are left out of the listing.
func (r *Runner) Stuck(ctx context.Context, cursor string, limit int) ([]RecordInfo, string, error) {
	if limit <= 0 {
		return nil, "", invalidArg("Stuck: limit must be positive, got %d", limit)
	}
	in, err := r.inspector("stuck")
	if err != nil {
		return nil, "", err
	}
	var (
		infos []RecordInfo
		next  string
	)
	err = r.retry(ctx, func(ctx context.Context) error {
		var err error
		infos, next, err = in.Stuck(ctx, cursor, limit)
		return err
	})
	if err != nil {
		return nil, "", &StoreError{Op: "stuck", Err: err}
	}
	return infos, next, nil
}

// Sweep deletes up to limit expired records (limit <= 0: all), through
// the store's [Sweeper], and reports how many it deleted. Stores whose
// backend expires records itself (Redis, etcd) need no sweeping and
// return an error matching errors.ErrUnsupported.
func (r *Runner) Sweep(ctx context.Context, limit int) (int, error) {
	sw := r.caps.Sweeper
	if sw == nil {
		return 0, fmt.Errorf("idempotency: sweep: the store (%T) has no Sweeper (Capabilities): it expires records itself: %w", r.store, errors.ErrUnsupported)
	}
	n, err := sw.Sweep(ctx, limit)
	if err != nil {
		return n, &StoreError{Op: "sweep", Err: err}
	}
	return n, nil
}

func (r *Runner) adminKey(req Request) (string, error) {
	return storageKey(req.Scope, req.Key, r.cfg.maxKeyLen)
}
