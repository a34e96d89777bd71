package testservers

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestNoDaemon checks the path every machine without Docker takes: a
// daemon that does not answer is reported, quickly, as ErrNoDaemon with
// where it was looked for. (With a daemon, the harness is exercised by
// scripts/servers/mongo.sh in CI, which starts mongo:7 through it.)
func TestNoDaemon(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	start := time.Now()
	_, err := Start("mongo", time.Minute)
	if !errors.Is(err, ErrNoDaemon) || !strings.Contains(err.Error(), "/nonexistent/docker.sock") {
		t.Errorf("Start without a daemon: %v, want ErrNoDaemon naming the socket", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v to find no daemon", time.Since(start))
	}
	if err := Remove("0123"); !errors.Is(err, ErrNoDaemon) {
		t.Errorf("Remove without a daemon: %v", err)
	}
}

func TestSpecs(t *testing.T) {
	if _, err := Start("nosuch", time.Second); err == nil || !strings.Contains(err.Error(), "mongo") {
		t.Errorf("unknown server: %v", err)
	}
	want := map[string]string{
		"mongo":    "IDEM_MONGO_URI=mongodb://127.0.0.1:1234/?directConnection=true",
		"postgres": "IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:1234/idem?sslmode=disable",
		"redis":    "IDEM_REDIS_ADDR=127.0.0.1:1234",
		"etcd":     "IDEM_ETCD_ENDPOINTS=127.0.0.1:1234",
	}
	for name, spec := range Specs {
		var got []string
		for k, v := range spec.Exports("127.0.0.1:1234") {
			got = append(got, k+"="+v)
		}
		if len(got) != 1 || got[0] != want[name] {
			t.Errorf("%s exports %v, want %s", name, got, want[name])
		}
		if spec.Repository == "" || spec.Tag == "" || spec.Port == "" || spec.Ready == nil {
			t.Errorf("%s: incomplete spec %+v", name, spec)
		}
	}
}
