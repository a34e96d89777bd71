package mongo_test

import (
	"fmt"
	"os"
	"testing"
)

// The real-server suite (server_test.go, example_test.go) runs against
// the MongoDB at IDEM_MONGO_URI. scripts/test.sh gets one from
// scripts/servers/mongo.sh, which starts mongo:7 as a single-member
// replica set with dockertest when a Docker daemon answers, and otherwise
// sets IDEM_MONGO_ABSENT to the reason none could be had. Then the suite
// is skipped, this TestMain says so, and scripts/test.sh ends with a loud
// line saying it did not run. Without either variable the test binary
// fails after running the other tests: a missing server is never a pass
// by accident.
const (
	envURI    = "IDEM_MONGO_URI"
	envAbsent = "IDEM_MONGO_ABSENT"
	howTo     = "set " + envURI + " (e.g. mongodb://127.0.0.1:27017/?directConnection=true), or run `make test` or `eval $(scripts/servers/mongo.sh start DIR)`, which start mongo:7 when a Docker daemon answers"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if os.Getenv(envURI) == "" {
		if reason := os.Getenv(envAbsent); reason != "" {
			fmt.Fprintf(os.Stderr, "\n!!! store/mongo: THE MONGODB REAL-SERVER SUITE DID NOT RUN: %s. Only the tests that need no server ran. !!!\n\n", reason)
		} else {
			fmt.Fprintf(os.Stderr, "\nFAIL store/mongo: the MongoDB real-server suite needs a server and got none: %s. To run only the tests that need no server, set %s to the reason.\n\n", howTo, envAbsent)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}
