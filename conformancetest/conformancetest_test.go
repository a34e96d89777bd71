package conformancetest_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/conformancetest"
	"github.com/exactlyonce/idempotency/store/memory"
)

// The reference store passes the suite (store/memory's tests also run it
// in real time).
func TestMemoryStorePasses(t *testing.T) {
	conformancetest.Run(t, func(t *testing.T, clock *conformancetest.Clock) idempotency.Store {
		return memStore(&memory.Options{Now: clock.Now})
	}, conformancetest.Capabilities{ControlledClock: true})
}

func TestClock(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := conformancetest.NewClock(start)
	if !c.Now().Equal(start) {
		t.Fatalf("Now() = %v, want %v", c.Now(), start)
	}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			c.Advance(time.Second)
			_ = c.Now()
		})
	}
	wg.Wait()
	c.Advance(-time.Hour) // ignored: the clock never runs backwards
	if got, want := c.Now(), start.Add(100*time.Second); !got.Equal(want) {
		t.Fatalf("after 100 concurrent Advance(1s) and one negative: Now() = %v, want %v", got, want)
	}
}

func ExampleClock() {
	clock := conformancetest.NewClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	clock.Advance(90 * time.Second)
	fmt.Println(clock.Now().Format(time.TimeOnly))
	// Output: 12:01:30
}
