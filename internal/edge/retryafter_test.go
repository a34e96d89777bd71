package edge

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{"-1", 0, false},
		{"soon", 0, false},
		{"999999999999", MaxRetryAfter, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{now.Add(1000 * time.Hour).Format(http.TimeFormat), MaxRetryAfter, true},
	} {
		if got, ok := RetryAfter(c.v, now); got != c.want || ok != c.ok {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", c.v, got, ok, c.want, c.ok)
		}
	}
}

func TestValidToken(t *testing.T) {
	for s, want := range map[string]bool{
		"Idempotency-Key": true, "POST": true, "x!#$%&'*+-.^_`|~9": true,
		"": false, "bad header": false, "a:b": false, "é": false, "a\x7f": false,
	} {
		if ValidToken(s) != want {
			t.Errorf("ValidToken(%q) = %v", s, !want)
		}
	}
}
