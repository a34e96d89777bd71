package postgres_test

import (
	"sync"
	"testing"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/jackc/pgx/v5"
)

// testMaxValueSize is below the default so that the suite's too_large case
// checks the limit without megabytes of traffic per case.
const testMaxValueSize = 256 << 10

// The suite runs in the three pgx query modes: the default (extended
// protocol, statements prepared and cached per connection), exec (extended
// protocol without prepared statements) and simple protocol. The last two
// are what PgBouncer's transaction pooling allows.
//
// Claim's two plain statements run in either order (the insertion or the
// read first, chosen from the recent claims): the exec mode pins the read
// first and the simple protocol the insertion first, so that every case
// is decided by both orders; the default mode lets the store choose. The
// exec mode's stores also read one block of the table per Stuck call, so
// that its listing goes over many pages, empty ones among them, with
// cursors at the ends of the blocks read as well as at records listed.
var execModes = []struct {
	name string
	mode pgx.QueryExecMode
	pin  func(*postgres.Store)
}{
	{"extended", pgx.QueryExecModeCacheStatement, func(*postgres.Store) {}},
	{"exec", pgx.QueryExecModeExec, func(s *postgres.Store) { postgres.PinClaimOrder(s, true); postgres.SetStuckScan(s, 1) }},
	{"simple_protocol", pgx.QueryExecModeSimpleProtocol, func(s *postgres.Store) { postgres.PinClaimOrder(s, false) }},
}

func TestConformance(t *testing.T) {
	for _, m := range execModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			db := testPool(t, m.mode)
			// One table per mode, migrated once: every case uses keys of
			// its own.
			var once sync.Once
			var table string
			conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
				once.Do(func() { table = newStoreTable(t, db) })
				s, err := postgres.New(db, &postgres.Options{Schema: testSchema, Table: table, MaxValueSize: testMaxValueSize})
				if err != nil {
					t.Fatal(err)
				}
				m.pin(s)
				return s
			}, conformancetest.Capabilities{})
		})
	}
}

// TestConformanceNotify runs the suite, Watcher cases included, on stores
// with Options.Notify, in the default query mode and in exec mode (the
// notifying statements take one parameter more).
func TestConformanceNotify(t *testing.T) {
	for _, m := range execModes[:2] {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			db := testPool(t, m.mode)
			var once sync.Once
			var table string
			conformancetest.Run(t, func(t *testing.T, _ *conformancetest.Clock) idempotency.Store {
				once.Do(func() { table = newStoreTable(t, db) })
				s, err := postgres.New(db, &postgres.Options{Schema: testSchema, Table: table, MaxValueSize: testMaxValueSize, Notify: true})
				if err != nil {
					t.Fatal(err)
				}
				m.pin(s)
				t.Cleanup(func() { _ = s.Close() })
				return s
			}, conformancetest.Capabilities{})
		})
	}
}

func newStoreTable(t testing.TB, db postgres.DB) string {
	table := "conf_" + randomHex(6)
	newStore(t, db, &postgres.Options{Table: table})
	return table
}
