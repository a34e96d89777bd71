package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/queue"
)

// A queue with a pending item and a dead letter (a 422), closed, as the
// operator finds it.
func fixture(t *testing.T) (file, pending, dead string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnprocessableEntity)
		w.Write([]byte(`{"error":"bad sale"}`))
	}))
	defer srv.Close()
	file = filepath.Join(t.TempDir(), "sales.queue")
	q, err := queue.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", srv.URL+"/sales", strings.NewReader(`{"amount":1}`))
	dead, err = q.Enqueue(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, d, _ := q.Len(); d == 1 {
				cancel()
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	q.Run(ctx)
	req, _ = http.NewRequest("POST", "http://127.0.0.1:1/sales", strings.NewReader(`{"amount":2}`))
	if pending, err = q.Enqueue(req, queue.InOrder("till-7")); err != nil {
		t.Fatal(err)
	}
	q.Close()
	return file, pending, dead
}

func ctl(t *testing.T, want int, args ...string) (string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if got := run(args, &out, &errb); got != want {
		t.Fatalf("queuectl %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), got, want, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	file, pending, dead := fixture(t)

	out, _ := ctl(t, exitOK, file, "list")
	if !strings.Contains(out, pending) || !strings.Contains(out, "till-7") || strings.Contains(out, dead) {
		t.Errorf("list:\n%s", out)
	}
	out, _ = ctl(t, exitOK, file, "list", "-dead")
	if !strings.Contains(out, dead) || !strings.Contains(out, "422") || strings.Contains(out, pending) {
		t.Errorf("list -dead:\n%s", out)
	}
	out, _ = ctl(t, exitOK, file, "inspect", dead)
	for _, want := range []string{"key:       " + dead, "state:     dead", `{"amount":1}`, "answer:    422", "bad sale"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect: no %q in\n%s", want, out)
		}
	}
	out, _ = ctl(t, exitOK, "-json", file, "inspect", pending)
	var j itemJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.Key != pending || j.State != "pending" || j.Body != `{"amount":2}` {
		t.Errorf("inspect -json: %+v, %v\n%s", j, err, out)
	}

	ctl(t, exitOK, file, "retry", dead)
	out, _ = ctl(t, exitOK, "-json", file, "list")
	var items []itemJSON
	if err := json.Unmarshal([]byte(out), &items); err != nil || len(items) != 2 || items[0].Key != dead || items[1].Key != pending {
		t.Errorf("after retry, list -json: %+v, %v", items, err)
	}
	ctl(t, exitOK, file, "drop", dead)
	ctl(t, exitOK, file, "drop", "-id", "2")
	out, _ = ctl(t, exitOK, "-json", file, "list")
	if strings.TrimSpace(out) != "[]" {
		t.Errorf("after the drops: %s", out)
	}

	ctl(t, exitNotFound, file, "inspect", "no-such-key")
	ctl(t, exitNotFound, file, "drop", "no-such-key")
	ctl(t, exitUsage, file, "frobnicate")
	ctl(t, exitUsage, file, "inspect")
	ctl(t, exitUsage, file, "drop", "-id", "3", "key")
	ctl(t, exitUsage, file)
	_, stderr := ctl(t, exitFailed, filepath.Join(t.TempDir(), "typo.queue"), "list")
	if !strings.Contains(stderr, "no such file") {
		t.Errorf("a missing file: %s", stderr)
	}

	q, err := queue.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	_, stderr = ctl(t, exitLocked, file, "list")
	if !strings.Contains(stderr, "in use") {
		t.Errorf("a file in use: %s", stderr)
	}
}
