module github.com/exactlyonce/idempotency/tools/release

go 1.26.0

require golang.org/x/mod v0.43.0

// This module is never tagged or published: it is the release tool (see
// RELEASING.md).
