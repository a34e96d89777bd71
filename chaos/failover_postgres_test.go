package chaos_test

// §3 of issue 14, PostgreSQL: a server of the test's own
// (scripts/servers/postgres.sh on a directory of its own, never the shared
// server) is stopped mid-run, with pg_ctl's fast or immediate shutdown, and
// started again; clients in the transactional mode (TxExecutor: the key,
// the effect row and the result commit together) run on fresh keys before
// and retry after, repointed to the restarted server. Asserted: no intent
// has two effect rows, and, with synchronous_commit on, every completion
// acknowledged to a client is still there with its effect. With
// synchronous_commit off (the setting of the test servers), an immediate
// shutdown may lose the last acknowledged commits: measured, not asserted,
// and a lost commit loses the key and its effect together, so the retry
// runs fn once.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/chaos"
	idempg "github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	foPGWorkers = 4
	foPGTrials  = 4 // in `make test`
	foPGTable   = "chaos_fo_keys"
)

// foPG is the service's side of one server start: a pool, the store and
// the executor.
type foPG struct {
	pool *pgxpool.Pool
	ex   *idempg.TxExecutor
	r    *idempotency.Runner
}

func foPGConnect(t *testing.T, url string, syncCommit bool) *foPG {
	sc := "off"
	if syncCommit {
		sc = "on"
	}
	pool := netPool(t, url+"&synchronous_commit="+sc, nil)
	s, err := idempg.New(pool, &idempg.Options{Table: foPGTable})
	if err != nil {
		t.Fatal(err)
	}
	r := netRunner(t, s)
	ex, err := idempg.NewTxExecutor(pool, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &foPG{pool: pool, ex: ex, r: r}
}

func TestFailoverPostgresRestart(t *testing.T) {
	t.Parallel()
	srv := srvStartPostgres(t)
	ctx := context.Background()
	setup := foPGConnect(t, srv.URL, true)
	s, _ := idempg.New(setup.pool, &idempg.Options{Table: foPGTable})
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS chaos_fo_effects (intent text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	setup.pool.Close()
	var tally chaos.Tally
	run := srvRunID(t)
	chaos.Run(t, chaos.FromEnv(t, foPGTrials), func(t *testing.T, tr chaos.Trial) {
		foPGTrial(t, tr, srv, &tally, run)
	})
	tally.Report(t)
}

func foPGTrial(t *testing.T, tr chaos.Trial, srv *srvPostgres, tally *chaos.Tally, run string) {
	mode := chaos.Pick(tr, "fast", "immediate")
	syncCommit := chaos.Pick(tr, true, false)
	at := tr.Between(50*time.Millisecond, 400*time.Millisecond)
	work := tr.Between(0, 10*time.Millisecond)
	backend := "postgres (DoTx, synchronous_commit=off)"
	if syncCommit {
		backend = "postgres (DoTx, synchronous_commit=on)"
	}
	fault := "restart, " + mode + " shutdown"
	t.Logf("%s: %s after %v, fn works %v", backend, fault, at, work)

	var current atomic.Pointer[foPG]
	current.Store(foPGConnect(t, srv.URL, syncCommit))
	type key struct{ acked atomic.Bool }
	var (
		stop  atomic.Bool
		mu    sync.Mutex
		keys  = map[string]*key{}
		order []string
		wg    sync.WaitGroup
	)
	call := func(ctx context.Context, name string) (idempotency.Result[[]byte], error) {
		return current.Load().ex.Execute(ctx, netRequest(name), func(ctx context.Context) ([]byte, error) {
			tx, _ := idempg.TxFromContext(ctx)
			info, _ := idempotency.FromContext(ctx)
			time.Sleep(work)
			if _, err := tx.Exec(ctx, `INSERT INTO chaos_fo_effects (intent, fence) VALUES ($1, $2)`, name, info.Fence); err != nil {
				return nil, err
			}
			return []byte(strconv.FormatInt(info.Fence, 10)), nil
		})
	}
	for w := range foPGWorkers {
		wg.Go(func() {
			for j := 0; j < 100000 && !stop.Load(); j++ {
				name := fmt.Sprintf("%s-%d-%d-%d-%d", run, tr.Seed, tr.Index, w, j)
				k := &key{}
				mu.Lock()
				keys[name], order = k, append(order, name)
				mu.Unlock()
				for !stop.Load() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					_, err := call(ctx, name)
					cancel()
					if err == nil {
						k.acked.Store(true)
						break
					}
					var se *idempotency.StoreError
					if errors.As(err, &se) && se.Ran {
						t.Errorf("key %s: transactional mode returned StoreError.Ran true: %v", name, err)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(at)
	downAt := time.Now()
	srv.Stop(mode)
	stop.Store(true)
	wg.Wait()
	current.Load().pool.Close()
	srv.Start()
	current.Store(foPGConnect(t, srv.URL, syncCommit))

	row := chaos.Row{Backend: backend, Fault: fault, Trials: 1, Faults: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	effects := func(name string) int {
		var n int
		if err := current.Load().pool.QueryRow(ctx, `SELECT count(*) FROM chaos_fo_effects WHERE intent = $1`, name).Scan(&n); err != nil {
			t.Fatalf("count effects: %v", err)
		}
		return n
	}
	acked := 0
	for _, name := range order {
		if !keys[name].acked.Load() {
			continue
		}
		acked++
		info, err := current.Load().r.Inspect(ctx, netRequest(name), false)
		if err != nil && !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("inspect %s: %v", name, err)
		}
		if err != nil || info.State != idempotency.StateCompleted || effects(name) != 1 {
			row.LostAcks++
		}
	}
	// The clients retry every key on the restarted server.
	bound := 10 * time.Second
	var back time.Time // the first result after the restart
	for _, name := range order {
		for {
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := call(c, name)
			cancel()
			if err == nil {
				if back.IsZero() {
					back = time.Now()
				}
				break
			}
			if time.Since(downAt) > bound {
				t.Fatalf("key %s: no result %v after the restart began: %v", name, time.Since(downAt).Round(time.Millisecond), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if n := effects(name); n != 1 {
			row.DuplicateEffects += max(n-1, 0)
			t.Errorf("key %s: %d effect rows after its retry, want 1", name, n)
		}
	}
	row.MaxUnavailable = back.Sub(downAt)
	t.Logf("%d keys, %d acknowledged, %d lost; unavailable for %v", len(order), acked, row.LostAcks, row.MaxUnavailable.Round(time.Millisecond))
	tally.Add(row)
	if syncCommit && row.LostAcks > 0 {
		t.Errorf("synchronous_commit=on: %d acknowledged completions lost at a %s shutdown", row.LostAcks, mode)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		t.Fatal(ctxErr)
	}
}
