package period_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/period"
	"github.com/exactlyonce/idempotency/store/memory"
)

func mustPeriod(p period.Period, err error) period.Period {
	if err != nil {
		panic(err)
	}
	return p
}

func at(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Days in Europe/Paris across both daylight saving changes of 2026 (a
// 23-hour day on 29 March, a 25-hour day on 25 October) and a month end:
// every instant of a calendar day has its key, and no instant of another.
func TestDayAcrossDSTAndMonthEnd(t *testing.T) {
	paris := mustPeriod(period.Day("Europe/Paris"))
	for _, tc := range []struct{ instant, key string }{
		// 29 March: 00:00 CET is 23:00Z the day before; 02:00 CET becomes
		// 03:00 CEST; the day ends at 22:00Z.
		{"2026-03-28T22:59:59Z", "invoices/day/2026-03-28/Europe/Paris"},
		{"2026-03-28T23:00:00Z", "invoices/day/2026-03-29/Europe/Paris"},
		{"2026-03-29T01:30:00Z", "invoices/day/2026-03-29/Europe/Paris"}, // 03:30 CEST
		{"2026-03-29T21:59:59Z", "invoices/day/2026-03-29/Europe/Paris"},
		{"2026-03-29T22:00:00Z", "invoices/day/2026-03-30/Europe/Paris"},
		// 25 October: 25 hours, 22:00Z the day before to 23:00Z.
		{"2026-10-24T22:00:00Z", "invoices/day/2026-10-25/Europe/Paris"},
		{"2026-10-25T00:30:00Z", "invoices/day/2026-10-25/Europe/Paris"}, // 02:30 CEST
		{"2026-10-25T01:30:00Z", "invoices/day/2026-10-25/Europe/Paris"}, // 02:30 CET, again
		{"2026-10-25T22:59:59Z", "invoices/day/2026-10-25/Europe/Paris"},
		{"2026-10-25T23:00:00Z", "invoices/day/2026-10-26/Europe/Paris"},
		// A month end: 31 January ends at 23:00Z.
		{"2026-01-31T22:59:59Z", "invoices/day/2026-01-31/Europe/Paris"},
		{"2026-01-31T23:00:00Z", "invoices/day/2026-02-01/Europe/Paris"},
	} {
		if got := paris.Key("invoices", at(t, tc.instant)); got != tc.key {
			t.Errorf("%s: %q, want %q", tc.instant, got, tc.key)
		}
	}
	for _, tc := range []struct {
		day  string
		want time.Duration
	}{{"2026-03-29T12:00:00Z", 23 * time.Hour}, {"2026-10-25T12:00:00Z", 25 * time.Hour}, {"2026-06-01T12:00:00Z", 24 * time.Hour}} {
		i := at(t, tc.day)
		if got := paris.End(i).Sub(paris.Start(i)); got != tc.want {
			t.Errorf("the day of %s lasts %v, want %v", tc.day, got, tc.want)
		}
	}
	// The zone is part of the key: the same instant, another zone.
	utc := mustPeriod(period.Day("UTC"))
	if a, b := paris.Key("j", at(t, "2026-01-31T23:30:00Z")), utc.Key("j", at(t, "2026-01-31T23:30:00Z")); a == b || b != "j/day/2026-01-31/UTC" {
		t.Errorf("Paris %q, UTC %q: want different keys, UTC on the 31st", a, b)
	}
}

// Months end where the zone's calendar says, February and leap years
// included.
func TestMonth(t *testing.T) {
	ny := mustPeriod(period.Month("America/New_York"))
	for _, tc := range []struct{ instant, key string }{
		{"2026-03-01T04:59:59Z", "m/month/2026-02/America/New_York"}, // 23:59:59 EST on 28 Feb
		{"2026-03-01T05:00:00Z", "m/month/2026-03/America/New_York"},
		{"2028-02-29T12:00:00Z", "m/month/2028-02/America/New_York"},
		{"2026-12-31T23:00:00Z", "m/month/2026-12/America/New_York"},
		{"2027-01-01T05:00:00Z", "m/month/2027-01/America/New_York"},
	} {
		if got := ny.Key("m", at(t, tc.instant)); got != tc.key {
			t.Errorf("%s: %q, want %q", tc.instant, got, tc.key)
		}
	}
	if got := ny.End(at(t, "2026-02-10T00:00:00Z")); !got.Equal(at(t, "2026-03-01T05:00:00Z")) {
		t.Errorf("February 2026 ends at %v", got)
	}
}

// Fixed intervals count from the epoch in UTC: time zones and daylight
// saving changes do not move them.
func TestEvery(t *testing.T) {
	q := mustPeriod(period.Every(15 * time.Minute))
	paris, _ := time.LoadLocation("Europe/Paris")
	i := at(t, "2026-03-29T01:59:59Z").In(paris) // 03:59:59 CEST
	if got := q.Key("sync", i); got != "sync/every-900s/2026-03-29T01:45:00Z" {
		t.Errorf("%q", got)
	}
	if got := q.Key("sync", at(t, "2026-03-29T02:00:00Z")); got != "sync/every-900s/2026-03-29T02:00:00Z" {
		t.Errorf("%q", got)
	}
	if got := q.Start(time.Unix(-1, 0)); got.Unix() != -900 {
		t.Errorf("before the epoch: start %v, want -900s", got.Unix())
	}
}

// A zero interval, an unknown zone, and a zone that depends on the
// machine are refused with a clear error.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"zero interval", second(period.Every(0)), "Every(0s)"},
		{"sub-second interval", second(period.Every(1500 * time.Millisecond)), "whole number of seconds"},
		{"negative interval", second(period.Every(-time.Hour)), "Every(-1h0m0s)"},
		{"unknown zone", second(period.Day("Mars/Olympus_Mons")), "unknown time zone"},
		{"empty zone", second(period.Month("")), "name the time zone"},
		{"Local", second(period.Day("Local")), "name the time zone"},
	} {
		if !errors.Is(tc.err, idempotency.ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.want) || !strings.Contains(tc.err.Error(), "period: ") {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, tc.err, tc.want)
		}
	}
}

func second(_ period.Period, err error) error { return err }

// Two schedulers fire the invoice job for the same day, at once and then
// one after the other (a late firing after a leader election): one
// invoice is sent.
func TestTwoSchedulersOneInvoice(t *testing.T) {
	store, err := memory.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	runner, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	day := mustPeriod(period.Day("Europe/Paris"))
	var invoices atomic.Int64
	fire := func(scheduled time.Time) error {
		req := idempotency.Request{Scope: []string{"billing"}, Key: day.Key("invoices", scheduled)}
		_, err := idempotency.Do(context.Background(), runner, req, func(ctx context.Context) (int64, error) {
			time.Sleep(20 * time.Millisecond) // sending takes a while
			return invoices.Add(1), nil
		})
		if errors.Is(err, idempotency.ErrInProgress) {
			return nil // the other scheduler is sending it
		}
		return err
	}
	// Two instances whose clocks differ by a few seconds, within the day.
	a, b := at(t, "2026-03-29T06:00:00Z"), at(t, "2026-03-29T06:00:03Z")
	var wg sync.WaitGroup
	for _, s := range []time.Time{a, b, a, b} {
		wg.Go(func() {
			if err := fire(s); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := fire(a.Add(10 * time.Hour)); err != nil { // later the same day
		t.Fatal(err)
	}
	if invoices.Load() != 1 {
		t.Fatalf("%d invoices sent, want 1", invoices.Load())
	}
	if err := fire(a.Add(24 * time.Hour)); err != nil || invoices.Load() != 2 { // the next day's
		t.Fatalf("next day: %v, %d invoices, want 2", err, invoices.Load())
	}
}
