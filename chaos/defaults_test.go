package chaos_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency/chaos"
	"github.com/exactlyonce/idempotency/httpidem"
)

// TestEveryDefaultSurvivesACrash (issue 25, item 2): the payments service
// runs with every default of the runner and the middleware (a 30 s lease,
// no wait), a client with every default of httpidem's Transport pays
// through it, and the service is SIGKILLed after the charge, before its
// completion, then restarted at once. The crashed request's key stays
// STARTED until its lease ends; the client's retries get 409s meanwhile.
// With every default the client follows the lease the 409s tell
// (Idempotency-Lease-Remaining) and its retry after the lease takes the
// key over: one charge, and the client gets its 201. The control is the
// Transport's schedule before the lease header (WithMaxLeaseWait(0):
// 5 attempts within 30 s, Retry-After capped at 1 s): it gives up with a
// 409 after a few seconds, as the issue reported.
func TestEveryDefaultSurvivesACrash(t *testing.T) {
	pgURL := chaos.ServerEnv(t, "IDEM_POSTGRES_URL")
	bin := killBuild(t)
	pool := chaos.Pool(t, pgURL)
	run := fmt.Sprintf("chaosdefaults_%d_%08x", os.Getpid(), rand.Uint32())
	for _, tc := range []struct {
		name string
		opts []httpidem.ClientOption
		want int
	}{
		{"every default", nil, http.StatusCreated},
		{"control: the lease not followed", []httpidem.ClientOption{httpidem.WithMaxLeaseWait(0)}, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			name := run + "_" + strings.Fields(tc.name)[0]
			name = strings.TrimSuffix(name, ":")
			ledger, table := name+"_ledger", name+"_keys"
			killCreateLedger(t, pool, ledger)
			killPGStore(t, pool, table)
			args := []string{"-mode", "pg-do", "-table", table, "-postgres", pgURL, "-ledger", ledger, "-defaults", "-hooks"}
			p := killStart(t, bin, args, "127.0.0.1:0", &killPlan{point: killAfterEffect})

			var n killAttempts
			tr, err := httpidem.NewTransport(append([]httpidem.ClientOption{
				httpidem.WithBase(killCounting{base: &http.Transport{DisableKeepAlives: true}, n: &n})}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			key := httpidem.NewKey()
			type answer struct {
				status int
				body   string
				err    error
			}
			got := make(chan answer, 1)
			start := time.Now()
			go func() {
				req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/pay", strings.NewReader(`{"amount":7}`))
				httpidem.SetKey(req, key)
				resp, err := (&http.Client{Transport: tr}).Do(req)
				if err != nil {
					got <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				got <- answer{resp.StatusCode, string(b), err}
			}()
			select {
			case <-p.exited:
			case <-time.After(30 * time.Second):
				t.Fatal("the service was not killed after the effect")
			}
			killed := time.Now()
			killStart(t, bin, args, p.addr, nil) // restarted at once
			var a answer
			select {
			case a = <-got:
			case <-time.After(3 * time.Minute):
				t.Fatal("no answer 3 minutes after the kill: the Transport's budget is not bounded")
			}
			elapsed := time.Since(start)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			charges := killLedgerRows(t, ctx, pool, ledger, []string{key})[key]
			t.Logf("%s: %d after %v (%v after the kill), %v; %d charge(s)", tc.name, a.status,
				elapsed.Round(10*time.Millisecond), time.Since(killed).Round(10*time.Millisecond), &n, len(charges))
			if a.err != nil || a.status != tc.want {
				t.Fatalf("got %d %q (err %v), want %d", a.status, a.body, a.err, tc.want)
			}
			if len(charges) != 1 {
				t.Fatalf("%d charges, want 1", len(charges))
			}
		})
	}
}
