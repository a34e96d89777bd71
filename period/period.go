// Package period derives the idempotency key of a scheduled job from the
// period it processes, so that a job fired twice for one period (two
// schedulers after a leader election, a cron that retries, a restart) has
// one effect: every firing for the period uses the same key, on every
// instance, and [idempotency.Do] runs it once.
//
//	day, err := period.Day("Europe/Paris") // the time zone is explicit
//	key := day.Key("invoices", time.Now()) // "invoices/day/2026-03-29/Europe/Paris"
//	_, err = idempotency.Do(ctx, runner, idempotency.Request{Scope: []string{"billing"}, Key: key}, sendInvoices)
//
// A calendar period ([Day], [Month]) is the calendar day or month in its
// time zone, however long it is (a day of 23 or 25 hours across a
// daylight saving change); a fixed interval ([Every]) counts from the Unix
// epoch, in UTC, and is not affected by time zones at all. The key names
// the job, the kind of period, its start and the zone, so two schedules
// that differ in any of them never share a key. A key is honoured for the
// runner's retention: a period must end within it (a monthly job wants a
// retention of more than a month, or a key of the month kept by the job's
// own store), or a late firing runs again.
//
// It lives in a package of its own, beside the root package rather than in
// httpidem: scheduled jobs run [idempotency.Do] directly, with no HTTP in
// sight, and the root package keeps only what every call needs.
package period

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/exactlyonce/idempotency"
)

// A Period is a way of cutting time into periods: calendar days or months
// in a time zone, or fixed intervals. Make one with [Day], [Month] or
// [Every]; the zero Period is not usable.
type Period struct {
	kind  kind
	loc   *time.Location
	every time.Duration
}

type kind uint8

const (
	day kind = iota + 1
	month
	every
)

var errZero = errors.New("period: the zero Period: make one with Day, Month or Every")

// Day returns the calendar days of the time zone tz, an IANA name such as
// "Europe/Paris" or "UTC". It returns an error wrapping
// [idempotency.ErrInvalidArgument] for an unknown zone, and for "" and
// "Local", whose meaning depends on the machine: every instance must cut
// the days the same way.
func Day(tz string) (Period, error) { return calendar(day, "Day", tz) }

// Month returns the calendar months of the time zone tz, as [Day] does
// its days.
func Month(tz string) (Period, error) { return calendar(month, "Month", tz) }

func calendar(k kind, name, tz string) (Period, error) {
	if tz == "" || tz == "Local" {
		return Period{}, fmt.Errorf("%w: period: %s(%q): name the time zone (\"UTC\", \"Europe/Paris\"): the machine's own differs between instances", idempotency.ErrInvalidArgument, name, tz)
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return Period{}, fmt.Errorf("%w: period: %s(%q): unknown time zone: %v", idempotency.ErrInvalidArgument, name, tz, err)
	}
	return Period{kind: k, loc: loc}, nil
}

// Every returns fixed intervals of length d counted from the Unix epoch
// (1970-01-01T00:00:00Z): Every(time.Hour) starts a period on every full
// hour of UTC, Every(15*time.Minute) at :00, :15, :30 and :45. It returns
// an error wrapping [idempotency.ErrInvalidArgument] unless d is a whole
// number of seconds, at least one.
func Every(d time.Duration) (Period, error) {
	if d < time.Second || d%time.Second != 0 {
		return Period{}, fmt.Errorf("%w: period: Every(%v): the interval must be a whole number of seconds, at least 1s", idempotency.ErrInvalidArgument, d)
	}
	return Period{kind: every, every: d}, nil
}

// Start returns the start of the period that contains t.
func (p Period) Start(t time.Time) time.Time {
	switch p.kind {
	case day:
		t = t.In(p.loc)
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, p.loc)
	case month:
		t = t.In(p.loc)
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, p.loc)
	case every:
		s, n := t.Unix(), int64(p.every/time.Second)
		start := s - s%n
		if s%n < 0 {
			start -= n // before the epoch: round down, not toward zero
		}
		return time.Unix(start, 0).UTC()
	}
	panic(errZero)
}

// End returns the end of the period that contains t: the start of the
// next one.
func (p Period) End(t time.Time) time.Time {
	s := p.Start(t)
	switch p.kind {
	case day:
		return time.Date(s.Year(), s.Month(), s.Day()+1, 0, 0, 0, 0, p.loc)
	case month:
		return time.Date(s.Year(), s.Month()+1, 1, 0, 0, 0, 0, p.loc)
	}
	return s.Add(p.every)
}

// Key returns the idempotency key of job's run for the period that
// contains t: the same for every t in the period, on every instance, and
// different for another job, period kind, zone or interval. For
// example "invoices/day/2026-03-29/Europe/Paris",
// "invoices/month/2026-03/UTC" or "sync/every-900s/2026-03-29T10:15:00Z".
// Pass the time the run is for (the scheduled time, which a late firing
// keeps), not necessarily the time it runs.
func (p Period) Key(job string, t time.Time) string {
	s := p.Start(t)
	switch p.kind {
	case day:
		return job + "/day/" + s.Format("2006-01-02") + "/" + p.loc.String()
	case month:
		return job + "/month/" + s.Format("2006-01") + "/" + p.loc.String()
	}
	return job + "/every-" + strconv.FormatInt(int64(p.every/time.Second), 10) + "s/" + s.Format(time.RFC3339)
}
