package period_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/period"
	"github.com/exactlyonce/idempotency/store/memory"
)

// A daily invoice job keyed on the day it processes: however many
// schedulers fire it for that day, one invoice run happens.
func Example() {
	store, _ := memory.New(nil)
	runner, _ := idempotency.New(store)
	day, err := period.Day("Europe/Paris")
	if err != nil {
		panic(err)
	}
	send := func(ctx context.Context) (string, error) { return "invoices sent", nil }
	scheduled := time.Date(2026, 3, 29, 6, 0, 0, 0, time.UTC)
	for _, firing := range []time.Time{scheduled, scheduled.Add(2 * time.Second)} { // two schedulers
		key := day.Key("invoices", firing)
		res, err := idempotency.Do(context.Background(), runner, idempotency.Request{Scope: []string{"billing"}, Key: key}, send)
		fmt.Println(key, res.Value, "replayed:", res.Replayed, err)
	}
	// Output:
	// invoices/day/2026-03-29/Europe/Paris invoices sent replayed: false <nil>
	// invoices/day/2026-03-29/Europe/Paris invoices sent replayed: true <nil>
}
