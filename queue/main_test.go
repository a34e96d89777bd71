package queue_test

import (
	"os"
	"testing"
)

// TestMain runs the test binary as a child process when asked to (the
// full-disk test's, under a file size limit).
func TestMain(m *testing.M) {
	switch os.Getenv("QUEUE_TEST_CHILD") {
	case "":
		os.Exit(m.Run())
	case "fsize":
		fsizeChild()
		os.Exit(0)
	}
}
