package idempotency

import (
	"reflect"
	"time"
)

// Limits describes what a store can honour, so that [New] can refuse a
// configuration the store would break. The zero value means no limits.
type Limits struct {
	// MinLease is the shortest lease the store keeps faithfully. A store
	// whose leases have a coarse resolution (etcd's lease TTLs are whole
	// seconds, with a server minimum) declares it; [New] refuses a shorter
	// [WithLease], even with [WithUnsafeShortDurations].
	MinLease time.Duration
}

// LimitedStore is implemented by stores that have [Limits]. [New] asks
// once, at construction.
type LimitedStore interface {
	Limits() Limits
}

// isNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, channel or function: a typed nil such as (*postgres.Store)(nil),
// whose methods would panic on first use.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
