// Package typednil reports typed nils: an interface holding a nil pointer
// (a nil *postgres.Store given as an idempotency.Store), whose methods
// would panic on first use. The root package, the edges and the adapters
// refuse them in their constructors with this one check.
package typednil

import "reflect"

// Is reports whether v is nil or holds a nil pointer, map, slice, channel,
// function or interface.
func Is(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
