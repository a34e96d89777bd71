package integration

import (
	"testing"

	"github.com/exactlyonce/idempotency/store/memory"
)

// The same scenario on the memory store: a baseline for the two above.
func TestMemory(t *testing.T) {
	scenario(t, memory.New(nil))
}
