package etcd_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdScript runs scripts/servers/etcd.sh with command on dir, for a
// member of its own (not the one at IDEM_ETCD_ENDPOINTS), and returns the
// endpoint it printed.
func etcdScript(t *testing.T, command, dir string) string {
	t.Helper()
	cmd := exec.Command("bash", "../../scripts/servers/etcd.sh", command, dir)
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_ETCD_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "IDEM_ETCD_PORT=25790")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("etcd.sh %s: %v\n%s", command, err, out)
	}
	_, ep, _ := strings.Cut(strings.TrimSpace(string(out)), "IDEM_ETCD_ENDPOINTS=")
	return ep
}

// TestRestartKeepsRecords rehearses a restart of the member with
// scripts/servers/etcd.sh restart: a completed record replays after it, a
// stuck one is still listed with its fence and checkpoints and is taken
// over with a greater fence; a fresh start begins empty.
func TestRestartKeepsRecords(t *testing.T) {
	t.Parallel() // mostly waiting for the member to stop and start
	dir := t.TempDir()
	ep := etcdScript(t, "start", dir)
	t.Cleanup(func() { etcdScript(t, "stop", dir) })
	if ep == "" {
		t.Fatal("etcd.sh start printed no endpoint")
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := newStore(t, c, nil)
	r, err := idempotency.New(s, idempotency.WithStoreTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	done := idempotency.Request{Key: "done", Fingerprint: fp}
	if _, err := idempotency.Do(ctx, r, done, func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
		t.Fatal(err)
	}
	stuckKey, _ := r.StorageKey(idempotency.Request{Key: "stuck"})
	held := claim(t, s, stuckKey, tok("a"), time.Second, time.Hour)
	if err := s.Checkpoint(ctx, stuckKey, tok("a"), "charge", []byte("ch_2")); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if again := etcdScript(t, "restart", dir); again != ep {
		t.Fatalf("restart printed %q, want the same endpoint %q", again, ep)
	}
	// The client reconnects; its first calls may fail while it does.
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := idempotency.Do(ctx, r, done, func(context.Context) (string, error) { return "charged again", nil })
		if err == nil {
			if !res.Replayed || res.Value != "ch_1" {
				t.Fatalf("after the restart: %+v; want ch_1 replayed", res)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer after the restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the completed record replayed %v after the restart began", time.Since(start).Round(time.Millisecond))
	// A leader restarts every lease's TTL in full: the stuck record's
	// 1 s lease ends again a second or so after the restart.
	var infos []idempotency.RecordInfo
	for {
		infos, _, err = s.Stuck(ctx, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(infos) != 1 || infos[0].Key != stuckKey || infos[0].Fence != held.Fence || string(infos[0].Checkpoints["charge"]) != "ch_2" {
		t.Fatalf("Stuck after the restart: %+v; want the stuck record, fence %d, its checkpoint", infos, held.Fence)
	}
	if res := claim(t, s, stuckKey, tok("b"), time.Minute, time.Hour); res.Outcome != idempotency.OutcomeAcquired || res.Fence <= held.Fence || string(res.Checkpoints["charge"]) != "ch_2" {
		t.Fatalf("takeover after the restart: %+v; want a fence above %d and the checkpoint", res, held.Fence)
	}

	// A fresh start wipes the data.
	etcdScript(t, "start", dir)
	if _, err := s.Inspect(ctx, stuckKey); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Inspect after a fresh start: %v; want ErrNotFound", err)
	}
}
