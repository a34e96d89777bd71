// Package chaos is the fault-injection harness of the repository's tests:
// real process kills, network faults between a service and its store
// (toxiproxy, in-process) and store failovers, with the duplicate effects
// and lost acknowledged writes counted per backend and fault kind.
//
// It lives in a test-only module that is never tagged or published. The
// trials are its tests; this package holds what they share: the seeded
// schedule ([Schedule], [Run]) and the tally that becomes the README's
// "Reliability, measured" table ([Tally]).
//
// # Running
//
// `make test` runs a short, fixed-seed set. The long runs:
//
//	CHAOS_TRIALS=1000 CHAOS_BUDGET=30m go test -run . -timeout 2h ./chaos/...
//
// A failing trial prints the seed and index that replay it:
//
//	CHAOS_SEED=<seed> CHAOS_FIRST=<index> CHAOS_TRIALS=1 go test -run <TestName> ./chaos/...
//
// CHAOS_REPORT=FILE appends every tally's table rows to FILE.
package chaos
