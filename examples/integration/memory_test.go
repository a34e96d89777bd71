package integration

import (
	"testing"
)

// The same scenario on the memory store: a baseline for the two above.
func TestMemory(t *testing.T) {
	scenario(t, memStore(nil))
}
