// Package crashtrial is the queue's crash trial: a client process that
// submits through the queue is SIGKILLed at drawn points and restarted,
// many times, against an httpidem server on PostgreSQL and one on Redis,
// and the effects are counted: every item must have exactly one, in order,
// and every definitive answer must reach the client's handler.
//
// It is a test-only module, never tagged or published, so that the queue's
// own module requires no database driver. The trial is its test:
//
//	go test -run TestCrash ./queue/internal/crashtrial/
//	QUEUE_CRASH_TRIALS=200 go test -run TestCrash -timeout 30m ./queue/internal/crashtrial/
//
// See the queue's README for what it asserts and the figures.
package crashtrial
