package postgres

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
)

// The fuzz targets of this file give the pure functions that read what the
// statements return rows that no statement returns (damage, another
// version's schema). They run on their seed corpus (testdata/fuzz) in
// every go test; scripts/fuzz.sh fuzzes them for longer.

// FuzzParseCheckpoints checks the decoding of the checkpoints column: no
// panic; what is not an object of base64 values is refused with an error
// matching ErrCorrupt and naming the key; what is accepted encodes back
// to the same map; and any map encoded as the statements store it (jsonb
// of encoding/json's form) is decoded as it was.
func FuzzParseCheckpoints(f *testing.F) {
	for _, s := range []string{
		`{"call-gateway": "ImNoXzEi", "b": ""}`, `{}`, `null`, `[]`, `"x"`, `{"a": null}`,
		`{"a": "!!"}`, `{"a": "QQ"}`, `{"a": 1}`, `{"a": "QQ==", "a": "Qg=="}`, `{"a":`, ``, "{\"\xff\": \"\"}",
	} {
		f.Add(s, false)
	}
	f.Add("", true)
	f.Fuzz(func(t *testing.T, text string, null bool) {
		var p *string
		if !null {
			p = &text
		}
		m, err := parseCheckpoints("key-1", p)
		switch {
		case null:
			if m != nil || err != nil {
				t.Fatalf("NULL: %v, %v", m, err)
			}
		case err != nil:
			if !errors.Is(err, idempotency.ErrCorrupt) || !strings.Contains(err.Error(), `"key-1"`) || m != nil {
				t.Fatalf("%q: error %v (map %v) does not match ErrCorrupt or name the key", text, err, m)
			}
		default:
			if !json.Valid([]byte(text)) {
				t.Fatalf("%q: invalid JSON accepted as %v", text, m)
			}
			roundTrip(t, m)
		}
		// What a Checkpoint would have stored.
		roundTrip(t, map[string][]byte{text: []byte(text), "": {}})
	})
}

// roundTrip checks that m, encoded as the statements store it, is decoded
// as it was.
func roundTrip(t *testing.T, m map[string][]byte) {
	t.Helper()
	for name, v := range m {
		if v == nil {
			t.Fatalf("checkpoint %q decoded as nil", name)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	got, err := parseCheckpoints("key-1", &s)
	if err != nil {
		t.Fatalf("%q (encoded from %q): %v", s, m, err)
	}
	if len(got) != len(m) {
		t.Fatalf("%q: decoded %q, want %q", s, got, m)
	}
	for name, v := range m {
		// encoding/json keeps only valid UTF-8 names: compare through it.
		if g, ok := got[string(mustRoundTripName(name))]; !ok || !bytes.Equal(g, v) {
			t.Fatalf("%q: decoded %q, want %q", s, got, m)
		}
	}
}

func mustRoundTripName(name string) string {
	b, _ := json.Marshal(name)
	var s string
	json.Unmarshal(b, &s)
	return s
}

// FuzzClaimRow checks the reading of the claim statement's row against the
// Store contract: no panic; an error (an incomplete row, an unknown state,
// corrupt checkpoints) comes with no outcome at all; otherwise the outcome
// is one of the four, Acquired exactly for an inserted or taken-over row
// (with its checkpoints), Mismatch for another fingerprint, Replay with the
// stored result (never nil) for a completed row, InProgress with a
// RetryAfter that is never negative for a started one.
func FuzzClaimRow(f *testing.F) {
	f.Add(uint8(1|4), int64(1), int32(1), `{"s": "ImEi"}`, "", "", int64(0), []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "fp", "completed", int64(0), []byte("vx"), "fp")
	f.Add(uint8(8|16|32), int64(7), int32(2), "", "fp", "completed", int64(0), []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "fp", "started", int64(1500000), []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "fp", "started", int64(-1), []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "fp", "started", int64(1)<<62, []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "other", "started", int64(0), []byte(nil), "fp")
	f.Add(uint8(8|16), int64(7), int32(2), "", "fp", "COMPLETED", int64(0), []byte(nil), "fp")
	f.Add(uint8(8), int64(7), int32(2), "", "fp", "", int64(0), []byte(nil), "fp")
	f.Add(uint8(2|8|16), int64(7), int32(2), "", "fp", "started", int64(0), []byte(nil), "fp")
	f.Add(uint8(1|4), int64(1), int32(1), `{"s": 1}`, "", "", int64(0), []byte(nil), "fp")
	f.Fuzz(func(t *testing.T, flags uint8, fence int64, attempt int32, checkpoints, fingerprint, state string, retryMicros int64, result []byte, reqFP string) {
		c := claimRow{
			acquired: flags&1 != 0, stale: flags&2 != 0,
			fence: fence, attempt: attempt, retryAfterMicros: retryMicros, result: result,
		}
		if flags&4 != 0 {
			c.checkpoints = &checkpoints
		}
		if flags&8 != 0 {
			c.fingerprint = &fingerprint
		}
		if flags&16 != 0 {
			c.state = &state
		}
		if flags&32 != 0 {
			c.result = nil
		}
		req := idempotency.ClaimRequest{Key: "key-1", Fingerprint: idempotency.Fingerprint(reqFP), Token: "t"}
		res, ok, err := claimResult(c, req)
		if err != nil || !ok {
			if ok || !reflect.DeepEqual(res, idempotency.ClaimResult{}) {
				t.Fatalf("%+v: ok %v, err %v, with result %+v", c, ok, err, res)
			}
			if err == nil && (c.acquired || !c.stale) {
				t.Fatalf("%+v: neither decided nor refused", c)
			}
			if err != nil && !strings.Contains(err.Error(), `"key-1"`) {
				t.Fatalf("%+v: error %v does not name the key", c, err)
			}
			return
		}
		if res.Fence != fence || res.Attempt != int(attempt) {
			t.Fatalf("%+v: fence %d attempt %d", c, res.Fence, res.Attempt)
		}
		if (res.Outcome == idempotency.OutcomeAcquired) != c.acquired {
			t.Fatalf("%+v: outcome %v", c, res.Outcome)
		}
		if res.Checkpoints != nil && res.Outcome != idempotency.OutcomeAcquired {
			t.Fatalf("%+v: checkpoints with outcome %v", c, res.Outcome)
		}
		switch res.Outcome {
		case idempotency.OutcomeAcquired:
		case idempotency.OutcomeMismatch:
			if fingerprint == reqFP {
				t.Fatalf("%+v: mismatch for the same fingerprint", c)
			}
		case idempotency.OutcomeReplay:
			if fingerprint != reqFP || state != string(idempotency.StateCompleted) || res.Result == nil || !bytes.Equal(res.Result, c.result) {
				t.Fatalf("%+v: replay of %q", c, res.Result)
			}
		case idempotency.OutcomeInProgress:
			if fingerprint != reqFP || state != string(idempotency.StateStarted) || res.RetryAfter < 0 {
				t.Fatalf("%+v: in progress, retry after %v", c, res.RetryAfter)
			}
		default:
			t.Fatalf("%+v: outcome %v", c, res.Outcome)
		}
	})
}

// FuzzRecordInfo checks the reading of a row of infoColumns (Inspect,
// Stuck): no panic, durations never negative, checkpoints only for a
// started record, and an error matching ErrCorrupt for checkpoints that
// cannot be decoded.
func FuzzRecordInfo(f *testing.F) {
	f.Add("started", int64(5), int32(1), int64(1000), int64(2000), true, `{"s": "ImEi"}`)
	f.Add("completed", int64(5), int32(1), int64(-1), int64(1)<<62, true, `{"s": "ImEi"}`)
	f.Add("started", int64(5), int32(1), int64(0), int64(0), true, `{"s": "?"}`)
	f.Add("", int64(0), int32(0), int64(0), int64(0), false, ``)
	f.Fuzz(func(t *testing.T, state string, fence int64, attempt int32, leaseMicros, expMicros int64, hasCP bool, checkpoints string) {
		c := infoRow{key: "key-1", fingerprint: "fp", state: state, fence: fence, attempt: attempt, leaseMicros: leaseMicros, expMicros: expMicros}
		if hasCP {
			c.checkpoints = &checkpoints
		}
		info, err := recordInfo(c)
		if err != nil && !errors.Is(err, idempotency.ErrCorrupt) {
			t.Fatalf("%+v: error %v does not match ErrCorrupt", c, err)
		}
		if info.LeaseLeft < 0 || info.ExpiresIn < 0 {
			t.Fatalf("%+v: lease left %v, expires in %v", c, info.LeaseLeft, info.ExpiresIn)
		}
		if info.State != idempotency.StateStarted && (info.Checkpoints != nil || info.LeaseLeft != 0) {
			t.Fatalf("%+v: a %q record with checkpoints %v, lease left %v", c, state, info.Checkpoints, info.LeaseLeft)
		}
		if info.Key != "key-1" || info.Fence != fence || info.Attempt != int(attempt) || string(info.State) != state {
			t.Fatalf("%+v: read as %+v", c, info)
		}
	})
}
