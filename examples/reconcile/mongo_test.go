package reconcile_test

import (
	"io"
	"os"
	"testing"
)

// TestExampleMongo runs Example_mongo where a MongoDB is given
// (IDEM_MONGO_URI), and checks that it prints what the other stores'
// examples print. Where scripts/servers/mongo.sh said none could be had
// (IDEM_MONGO_ABSENT) it is skipped, and scripts/test.sh says so; with
// neither variable it fails.
func TestExampleMongo(t *testing.T) {
	if os.Getenv("IDEM_MONGO_URI") == "" {
		if reason := os.Getenv("IDEM_MONGO_ABSENT"); reason != "" {
			t.Skip("MongoDB not available: " + reason)
		}
		t.Fatal("IDEM_MONGO_URI is not set (nor IDEM_MONGO_ABSENT, the reason there is none): run scripts/test.sh")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		Example_mongo()
	}()
	w.Close()
	const want = "reconciled 2: 1 completed, 1 released (<nil>)\nretry of order-7: ch_1, replayed true\nretry of order-8: ch_2, replayed false\ncharges at the gateway: 2\n"
	if got := <-done; got != want {
		t.Errorf("Example_mongo printed\n%s\nwant\n%s", got, want)
	}
}
