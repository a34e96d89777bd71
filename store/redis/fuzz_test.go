package redis

import (
	"strconv"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
)

// parseRESP reads one reply in the RESP2 text form the fuzzer writes
// (":<int>", "$<len>" and the bytes, "*<n>" and n replies, "_" for nil),
// as go-redis hands it to the store: int64, string, []any, nil. It returns
// false for bytes that are no reply, which the target skips.
func parseRESP(b string, depth int) (any, string, bool) {
	if b == "" || depth > 8 {
		return nil, "", false
	}
	line, rest, ok := strings.Cut(b[1:], "\r\n")
	if !ok {
		return nil, "", false
	}
	switch b[0] {
	case '_':
		return nil, rest, line == ""
	case ':':
		n, err := strconv.ParseInt(line, 10, 64)
		return n, rest, err == nil
	case '$':
		n, err := strconv.Atoi(line)
		if err != nil || n < 0 || n+2 > len(rest) || rest[n:n+2] != "\r\n" {
			return nil, "", false
		}
		return rest[:n], rest[n+2:], true
	case '*':
		n, err := strconv.Atoi(line)
		if err != nil || n < 0 || n > 1000 {
			return nil, "", false
		}
		a := make([]any, 0, n)
		for range n {
			var v any
			if v, rest, ok = parseRESP(rest, depth+1); !ok {
				return nil, "", false
			}
			a = append(a, v)
		}
		return a, rest, true
	}
	return nil, "", false
}

// FuzzDecodeReplies feeds the decoders of the scripts' replies (claim,
// with its checkpoint pairs; stuck, with its records; a record's fields)
// arbitrary replies, as a server that is not Redis, a damaged record or
// another version's script could send. They never panic; an error names
// the store; and what they accept is consistent: a known outcome, a
// positive fence, an attempt of at least 1, a replay with a result, only
// string checkpoints, records in a known state.
//
//	go test -run '^$' -fuzz FuzzDecodeReplies -fuzztime 2m ./store/redis/
func FuzzDecodeReplies(f *testing.F) {
	for _, seed := range []string{
		"*4\r\n:1\r\n:1796121820000000\r\n:1\r\n$0\r\n\r\n",                                               // acquired
		"*8\r\n:1\r\n:1796121820000001\r\n:2\r\n$0\r\n\r\n$1\r\ns\r\n$1\r\n1\r\n$4\r\nstep\r\n$0\r\n\r\n", // takeover with checkpoints
		"*5\r\n:2\r\n:1796121820000000\r\n:1\r\n$9\r\nv\"result\"\r\n:86400000\r\n",                       // replay and its time to live
		"*4\r\n:2\r\n:1796121820000000\r\n:1\r\n$9\r\nv\"result\"\r\n",                                    // replay without its time to live
		"*4\r\n:3\r\n:1796121820000000\r\n:1\r\n:750\r\n",                                                 // in progress
		"*4\r\n:4\r\n:1796121820000000\r\n:1\r\n$0\r\n\r\n",                                               // mismatch
		"*5\r\n:1\r\n:1\r\n:1\r\n$0\r\n\r\n$1\r\nx\r\n",                                                   // checkpoint without a value
		"*4\r\n:2\r\n:1\r\n:1\r\n:5\r\n",                                                                  // replay with a number
		"*3\r\n:1\r\n:1\r\n:1\r\n",                                                                        // short
		"*4\r\n:9\r\n:1\r\n:1\r\n$0\r\n\r\n",                                                              // unknown outcome
		"*4\r\n:1\r\n:0\r\n:0\r\n$0\r\n\r\n",                                                              // zero fence and attempt
		":1\r\n", "_\r\n", "$2\r\nOK\r\n",
		// stuck: next cursor, done, now, records (key, PTTL, fields).
		"*4\r\n$3\r\n123\r\n:0\r\n:1796121821000\r\n*3\r\n$10\r\np:{abc}3:ab\r\n:5000\r\n*6\r\n$1\r\nn\r\n$3\r\n123\r\n$1\r\na\r\n$1\r\n1\r\n$1\r\nl\r\n$13\r\n1796121820000\r\n",
		"*4\r\n$1\r\n0\r\n:1\r\n:1\r\n*3\r\n$8\r\np:{abc}k\r\n:1\r\n*2\r\n$1\r\nn\r\n$3\r\nabc\r\n",
		"*4\r\n$1\r\n0\r\n:1\r\n:1\r\n*3\r\n$8\r\np:{abc}k\r\n:1\r\n*4\r\n$1\r\nr\r\n$1\r\nx\r\n$1\r\nf\r\n$2\r\nhx\r\n",
		"*4\r\n$1\r\n0\r\n:1\r\n:1\r\n*3\r\n$3\r\nq:k\r\n:1\r\n*0\r\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		v, _, ok := parseRESP(in, 0)
		if !ok {
			return
		}
		res, err := decodeClaim(v)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "redis: claim: ") {
				t.Fatalf("decodeClaim(%#v): error %q does not name the store", v, err)
			}
		} else {
			switch {
			case res.Outcome < idempotency.OutcomeAcquired || res.Outcome > idempotency.OutcomeMismatch:
				t.Fatalf("decodeClaim(%#v) accepted outcome %d", v, res.Outcome)
			case res.Fence <= 0 || res.Attempt < 1:
				t.Fatalf("decodeClaim(%#v) accepted fence %d, attempt %d", v, res.Fence, res.Attempt)
			case res.Outcome == idempotency.OutcomeReplay && res.Result == nil:
				t.Fatalf("decodeClaim(%#v): replay without a result", v)
			case res.Outcome != idempotency.OutcomeAcquired && res.Checkpoints != nil:
				t.Fatalf("decodeClaim(%#v): checkpoints with outcome %v", v, res.Outcome)
			case res.RetryAfter < 0:
				t.Fatalf("decodeClaim(%#v): negative retry-after", v)
			}
		}
		st, err := (&Store{prefix: "p:"}).decodeStuck(v)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "redis: ") {
				t.Fatalf("decodeStuck(%#v): error %q does not name the store", v, err)
			}
			return
		}
		if st.cursor == "" {
			t.Fatalf("decodeStuck(%#v) accepted an empty cursor", v)
		}
		for _, r := range st.records {
			if s := r.State; s != idempotency.StateStarted && s != idempotency.StateCompleted {
				t.Fatalf("decodeStuck(%#v) accepted state %q", v, s)
			}
			if r.LeaseLeft < 0 || r.ExpiresIn < 0 {
				t.Fatalf("decodeStuck(%#v): negative durations %+v", v, r)
			}
		}
	})
}
