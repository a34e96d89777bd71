package redis_test

import (
	"errors"
	"strings"
	"testing"

	idemredis "github.com/exactlyonce/idempotency/store/redis"
)

// TestOldServerErrorSaysWhy: what a server older than Redis 6.2 answers to
// the claim's SET ... GET (a syntax error raised inside a script; here a
// SET with an option no Redis knows) is reported with the version the
// store needs, and still wraps the server's error; other script errors
// and other errors are not.
func TestOldServerErrorSaysWhy(t *testing.T) {
	client := newSingle(t)
	s := newStore(t, client, nil)
	key := uniquePrefix() + "old-server"
	syntax := client.Eval(t.Context(), "return redis.call('SET', KEYS[1], 'v', 'NOSUCHOPTION')", []string{key}).Err()
	other := client.Eval(t.Context(), "return redis.call('NOSUCHCOMMAND')", []string{key}).Err()
	if syntax == nil || other == nil {
		t.Fatalf("the scripts did not fail: %v, %v", syntax, other)
	}
	for _, c := range []struct {
		err  error
		hint bool
	}{{syntax, true}, {other, false}, {errors.New("syntax error in a script, but not from Redis"), false}} {
		got := idemredis.Wrap(s, "claim", c.err)
		if strings.Contains(got.Error(), "Redis 6.2") != c.hint || !errors.Is(got, c.err) {
			t.Errorf("Wrap(%v) = %v; want the Redis 6.2 hint: %v, wrapping the error", c.err, got, c.hint)
		}
	}
}
