package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	if in, ok := r.store.(Inspector); ok {
		return in, nil
	}
	return nil, fmt.Errorf("idempotency: %s: the store (%T) does not implement Inspector: %w", op, r.store, errors.ErrUnsupported)
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
// reports an [EventPurged] to the observer. The next call with the key
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
	start := time.Now()
	err = r.retry(ctx, func(ctx context.Context) error { return in.Purge(ctx, key) })
	if err != nil {
		r.observe(ctx, Event{Kind: EventStoreError, Key: key, Scope: req.Scope, Duration: time.Since(start), Err: err})
		return &StoreError{Op: "purge", Err: err}
	}
	r.observe(ctx, Event{Kind: EventPurged, Key: key, Scope: req.Scope, Duration: time.Since(start)})
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
	sw, ok := r.store.(Sweeper)
	if !ok {
		return 0, fmt.Errorf("idempotency: sweep: the store (%T) expires records itself: %w", r.store, errors.ErrUnsupported)
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

// ParseStorageKey splits a storage key made by [StorageKey] (or a Runner)
// back into its scope parts and client key. It returns an error wrapping
// [ErrInvalidKey] for a string that is not such a key.
func ParseStorageKey(encoded string) (scope []string, key string, err error) {
	var parts []string
	for s := encoded; s != ""; {
		i := 0
		for i < len(s) && i < 5 && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 || i >= len(s) || s[i] != ':' || (i > 1 && s[0] == '0') {
			return nil, "", invalidKey("not a storage key", encoded)
		}
		n, _ := strconv.Atoi(s[:i])
		s = s[i+1:]
		if n > len(s) {
			return nil, "", invalidKey("not a storage key", encoded)
		}
		parts = append(parts, s[:n])
		s = s[n:]
	}
	if len(parts) == 0 {
		return nil, "", invalidKey("not a storage key", encoded)
	}
	scope, key = parts[:len(parts)-1], parts[len(parts)-1]
	// Only what StorageKey makes: no empty scope part or key, no control
	// characters, valid UTF-8 (the key's length is the runner's to limit).
	if _, err := storageKey(scope, key, len(key)); err != nil {
		return nil, "", fmt.Errorf("%w (not a storage key: %w)", ErrInvalidKey, err)
	}
	return scope, key, nil
}

// DescribeResult tells what a stored result (RecordInfo.Result) holds:
// kind "value" with the codec-encoded value, "bytes" with a []byte result
// stored as it is (the default codec's form of []byte results since
// v0.2.0), "error" with the codec-encoded message of a permanent error, or
// "not_stored" for the marker of a success whose result could not be kept.
func DescribeResult(stored []byte) (kind string, payload []byte, err error) {
	k, p, err := decodeResult(stored)
	if err != nil {
		return "", nil, err
	}
	switch k {
	case resultValue:
		return "value", p, nil
	case resultBytes:
		return "bytes", p, nil
	case resultError:
		return "error", p, nil
	}
	return "not_stored", nil, nil
}
