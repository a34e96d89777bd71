// Package fphook lets httpidem compute its default request fingerprint
// without the allocations of composing the root package's exported
// helpers (a boxed body, an intermediate fingerprint string). The root
// package sets JSONRequest when it is initialized.
package fphook

// JSONRequest returns the fingerprint
//
//	FingerprintParts(method, path, query, "json", string(FingerprintJSON(body)))
//
// and true, or false when FingerprintJSON refuses body.
var JSONRequest func(method, path, query string, body []byte) (string, bool)
