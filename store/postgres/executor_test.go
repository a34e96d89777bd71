package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// payServer is POST /payments on the HTTP middleware in transactional
// mode: the handler inserts the payment row through the executor's
// transaction. A body with "fail" makes it write its row and then answer
// 500, and a body with "decline" answers 402 after writing: both to see
// what is rolled back. After the insert it calls e.hold, when set.
func payServer(t *testing.T, e *txEnv, opts *postgres.TxExecutorOptions) *httptest.Server {
	t.Helper()
	exec, err := postgres.NewTxExecutor(e.pool, e.runner, opts)
	if err != nil {
		t.Fatal(err)
	}
	idem, err := httpidem.New(exec, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		return []string{"acct_1", r.Pattern}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := postgres.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+e.effects+" (key, note) VALUES ($1, $2) RETURNING id", key, string(body)).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if e.hold != nil {
			e.hold(key)
		}
		switch {
		case strings.Contains(string(body), "fail"):
			http.Error(w, "gateway down", http.StatusBadGateway)
			return
		case strings.Contains(string(body), "decline"):
			http.Error(w, "card declined", http.StatusPaymentRequired)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func postPayment(t *testing.T, url, key, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
}

// effectKeyRows counts the store's rows for key as the HTTP middleware
// scopes it.
func (e *txEnv) scopedKeyRows(t *testing.T, key string) int {
	sk, err := idempotency.StorageKey([]string{"acct_1", "POST /payments"}, key)
	if err != nil {
		t.Fatal(err)
	}
	return e.count(t, "SELECT count(*) FROM "+e.table+" WHERE key = $1 AND expires_at > clock_timestamp()", sk)
}

// TestHTTPTxConcurrentDuplicates: 20 concurrent duplicates of a payment
// through the middleware in transactional mode make one payment row. By
// default a duplicate waits on the first transaction's row lock for the
// short lock wait and gets its 201 replayed, or 409; on a runner with
// WithWait it waits between transactions and always gets the 201
// replayed; never a second row or another payment's response.
func TestHTTPTxConcurrentDuplicates(t *testing.T) {
	for _, c := range []struct {
		name     string
		opts     *postgres.Options
		wait     bool
		allow409 bool
	}{
		{"default_409", nil, false, true},
		{"runner_wait", nil, true, false},
		{"lock_wait_1ms_409", &postgres.Options{TxLockWait: time.Millisecond}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newTxEnv(t, c.opts)
			if c.wait {
				e.withRunner(t, idempotency.WithWait(time.Minute))
			}
			srv := payServer(t, e, nil)
			const n = 20
			type reply struct {
				status         int
				replayed, body string
			}
			replies := make([]reply, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					s, rp, b := postPayment(t, srv.URL, "pay-1", `{"amount":100}`)
					replies[i] = reply{s, rp, b}
				})
			}
			wg.Wait()
			if got := e.effectRows(t, "pay-1"); got != 1 {
				t.Fatalf("%d payment rows, want 1", got)
			}
			var first string
			fresh := 0
			for _, r := range replies {
				if isFresh(t, r.status, r.replayed, c.allow409) {
					fresh++
					first = r.body
				}
			}
			if fresh != 1 {
				t.Fatalf("%d fresh 201s, want 1: %+v", fresh, replies)
			}
			for _, r := range replies {
				if r.status == 201 && r.body != first {
					t.Fatalf("a duplicate got %q, the first got %q", r.body, first)
				}
			}
			// Every retry afterwards replays the committed response.
			if s, rp, b := postPayment(t, srv.URL, "pay-1", `{"amount":100}`); s != 201 || rp != "true" || b != first {
				t.Fatalf("retry: %d %q %q", s, rp, b)
			}
		})
	}
}

// isFresh reports whether a reply to one of concurrent duplicates is the
// first call's own 201, and fails t for a reply that is neither that, a
// replayed 201 nor, when allowed, a 409.
func isFresh(t *testing.T, status int, replayed string, allow409 bool) bool {
	t.Helper()
	switch {
	case status == 201 && replayed == "":
		return true
	case status == 201 && replayed == "true":
	case status == 409 && allow409:
	default:
		t.Errorf("reply %d (replayed %q), want 201 or, if allowed (%v), 409", status, replayed, allow409)
	}
	return false
}

// TestHTTPTxSemantics: a changed body is 422; a handler whose answer is
// not stored (5xx) has its payment row rolled back with the key, and the
// retry runs it again; a stored 4xx commits with its row.
func TestHTTPTxSemantics(t *testing.T) {
	e := newTxEnv(t, nil)
	srv := payServer(t, e, nil)

	if s, _, _ := postPayment(t, srv.URL, "k-422", `{"amount":1}`); s != 201 {
		t.Fatalf("first: %d", s)
	}
	s, _, b := postPayment(t, srv.URL, "k-422", `{"amount":2}`)
	var p httpidem.Problem
	if s != 422 || json.Unmarshal([]byte(b), &p) != nil || p.Type != httpidem.ProblemKeyReused {
		t.Fatalf("changed body: %d %q; want a 422 problem", s, b)
	}
	if got := e.effectRows(t, "k-422"); got != 1 {
		t.Fatalf("%d rows after the 422, want 1", got)
	}

	// The handler's transaction is rolled back: no key, no row.
	if s, _, _ := postPayment(t, srv.URL, "k-fail", `{"fail":true}`); s != 502 {
		t.Fatalf("failing handler: %d, want its 502", s)
	}
	if rows, keys := e.effectRows(t, "k-fail"), e.scopedKeyRows(t, "k-fail"); rows != 0 || keys != 0 {
		t.Fatalf("after the rolled-back handler: %d payment rows, %d keys; want none", rows, keys)
	}

	// A stored client error commits together with what the handler wrote.
	if s, _, _ := postPayment(t, srv.URL, "k-402", `{"decline":true}`); s != 402 {
		t.Fatalf("declining handler: %d", s)
	}
	if s, rp, _ := postPayment(t, srv.URL, "k-402", `{"decline":true}`); s != 402 || rp != "true" {
		t.Fatalf("retry of the 402: %d %q, want it replayed", s, rp)
	}
	if rows, keys := e.effectRows(t, "k-402"), e.scopedKeyRows(t, "k-402"); rows != 1 || keys != 1 {
		t.Fatalf("after the 402: %d rows, %d keys; want 1 and 1", rows, keys)
	}
}

// TestTxExecutorCommitFailure: when the transaction cannot commit, the
// effect is gone with the key, and the caller gets a StoreError with Ran
// false (HTTP: 503), not the result.
func TestTxExecutorCommitFailure(t *testing.T) {
	e := newTxEnv(t, nil)
	exec, err := postgres.NewTxExecutor(e.pool, e.runner, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A deferred constraint fails at COMMIT, after fn and the completion.
	tbl := testSchema + ".deferred_" + randomHex(6)
	if _, err := e.pool.Exec(t.Context(), "CREATE TABLE "+tbl+" (k text UNIQUE DEFERRABLE INITIALLY DEFERRED)"); err != nil {
		t.Fatal(err)
	}
	res, err := exec.Execute(t.Context(), req("commit-fails"), func(ctx context.Context) ([]byte, error) {
		tx, _ := postgres.TxFromContext(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO "+tbl+" VALUES ('x'), ('x')"); err != nil {
			return nil, err
		}
		_, err := e.insertEffect("commit-fails")(ctx, tx)
		return []byte("ok"), err
	})
	var se *idempotency.StoreError
	if !errors.As(err, &se) || se.Ran || se.Op != "commit" || res.Value != nil {
		t.Fatalf("Execute = %+v, %v; want a commit StoreError with Ran false", res, err)
	}
	if rows, keys := e.effectRows(t, "commit-fails"), e.keyRows(t, "commit-fails"); rows != 0 || keys != 0 {
		t.Fatalf("%d effect rows, %d keys after the failed commit; want none", rows, keys)
	}
}

func TestTxExecutorArguments(t *testing.T) {
	e := newTxEnv(t, nil)
	other, err := idempotency.New(memoryLikeStore{})
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"nil db":      func() error { _, err := postgres.NewTxExecutor(nil, e.runner, nil); return err },
		"nil runner":  func() error { _, err := postgres.NewTxExecutor(e.pool, nil, nil); return err },
		"other store": func() error { _, err := postgres.NewTxExecutor(e.pool, other, nil); return err },
		"negative attempts": func() error {
			_, err := postgres.NewTxExecutor(e.pool, e.runner, &postgres.TxExecutorOptions{MaxAttempts: -1})
			return err
		},
	} {
		if err := f(); !errors.Is(err, idempotency.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	exec, err := postgres.NewTxExecutor(e.pool, e.runner, &postgres.TxExecutorOptions{TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := postgres.TxFromContext(context.Background()); ok {
		t.Fatal("TxFromContext outside Execute found a transaction")
	}
	res, err := exec.Execute(t.Context(), req("args"), func(ctx context.Context) ([]byte, error) {
		if _, ok := postgres.TxFromContext(ctx); !ok {
			return nil, errors.New("no transaction in fn's context")
		}
		if info, ok := idempotency.FromContext(ctx); !ok || info.Key != "args" || info.Fence < 1 {
			return nil, fmt.Errorf("lease info %+v, %v", info, ok)
		}
		return []byte("v"), nil
	})
	if err != nil || string(res.Value) != "v" || res.Replayed {
		t.Fatalf("Execute = %+v, %v", res, err)
	}
}

// memoryLikeStore is a Store that is not a *postgres.Store.
type memoryLikeStore struct{ idempotency.Store }
