package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// formerBytes is a store that writes []byte results as versions before
// raw bytes did: 'v' and the JSON codec's base64 string. It stands for
// records left by an earlier version of the library.
type formerBytes struct{ *memory.Store }

func (s formerBytes) Complete(ctx context.Context, key string, token idempotency.Token, result []byte, retention time.Duration) error {
	if len(result) > 0 && result[0] == 'b' {
		enc, err := json.Marshal(result[1:])
		if err != nil {
			return err
		}
		result = append([]byte{'v'}, enc...)
	}
	return s.Store.Complete(ctx, key, token, result, retention)
}

func storedResult(t *testing.T, s *memory.Store, r *idempotency.Runner, key string) []byte {
	t.Helper()
	sk, err := r.StorageKey(idempotency.Request{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Inspect(context.Background(), sk)
	if err != nil {
		t.Fatal(err)
	}
	return info.Result
}

func TestBytesResultStoredRaw(t *testing.T) {
	ctx := context.Background()
	store := memStore(nil)
	r, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("\x00\xffraw bytes, not base64")
	for _, c := range []struct {
		key    string
		value  []byte
		stored string // the stored form
	}{
		{"raw", value, "b" + string(value)},
		{"empty", []byte{}, "b"},
		{"nil", nil, "vnull"}, // through the codec, so that it replays as nil
	} {
		for i := range 2 {
			res, err := idempotency.Do(ctx, r, idempotency.Request{Key: c.key}, func(context.Context) ([]byte, error) {
				return c.value, nil
			})
			if err != nil || res.Replayed != (i == 1) || !bytes.Equal(res.Value, c.value) || (res.Value == nil) != (c.value == nil) {
				t.Fatalf("%s, call %d: %+v, %v", c.key, i, res, err)
			}
		}
		if got := storedResult(t, store, r, c.key); string(got) != c.stored {
			t.Errorf("%s: stored %q, want %q", c.key, got, c.stored)
		}
	}
	kind, payload, err := idempotency.DescribeResult(storedResult(t, store, r, "raw"))
	if err != nil || kind != "bytes" || !bytes.Equal(payload, value) {
		t.Errorf("DescribeResult: %q %q %v", kind, payload, err)
	}

	// The limit applies to the bytes themselves.
	small, err := idempotency.New(store, idempotency.WithMaxResultSize(8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, small, idempotency.Request{Key: "large"}, func(context.Context) ([]byte, error) {
		return []byte("123456789"), nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Do(ctx, small, idempotency.Request{Key: "large"}, func(context.Context) ([]byte, error) {
		return nil, nil
	}); !errors.Is(err, idempotency.ErrResultNotStored) {
		t.Errorf("replay of a result over the limit: %v, want ErrResultNotStored", err)
	}
}

func TestBytesResultFormerFormat(t *testing.T) {
	ctx := context.Background()
	store := memStore(nil)
	old, err := idempotency.New(formerBytes{store})
	if err != nil {
		t.Fatal(err)
	}
	cur, err := idempotency.New(store)
	if err != nil {
		t.Fatal(err)
	}
	value := []byte("written by an earlier version")
	if _, err := idempotency.Do(ctx, old, idempotency.Request{Key: "k"}, func(context.Context) ([]byte, error) {
		return value, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := storedResult(t, store, cur, "k"); got[0] != 'v' || !bytes.Contains(got, []byte("d3JpdHRlbi")) {
		t.Fatalf("the former format was not written: %q", got)
	}
	res, err := idempotency.Do(ctx, cur, idempotency.Request{Key: "k"}, func(context.Context) ([]byte, error) {
		t.Fatal("fn ran for a stored result")
		return nil, nil
	})
	if err != nil || !res.Replayed || !bytes.Equal(res.Value, value) {
		t.Fatalf("replay of the former format: %+v, %v", res, err)
	}

	// Either form read as another type gives what the former one gave.
	raw := append([]byte{'b'}, value...)
	former := storedResult(t, store, cur, "k")
	a, errA := idempotency.DecodeOutcome[string](cur, raw)
	b, errB := idempotency.DecodeOutcome[string](cur, former)
	if errA != nil || errB != nil || a != b {
		t.Errorf("as a string: %q, %v from raw bytes; %q, %v from the former form", a, errA, b, errB)
	}
}

// upperCodec is a codec of the caller's: it must see []byte results too.
type upperCodec struct{ idempotency.JSONCodec }

func (c upperCodec) Marshal(v any) ([]byte, error) {
	b, err := c.JSONCodec.Marshal(v)
	return append([]byte("U"), b...), err
}

func (c upperCodec) Unmarshal(data []byte, v any) error {
	if len(data) == 0 || data[0] != 'U' {
		return errors.New("not encoded by upperCodec")
	}
	return c.JSONCodec.Unmarshal(data[1:], v)
}

func TestBytesResultCustomCodec(t *testing.T) {
	ctx := context.Background()
	store := memStore(nil)
	r, err := idempotency.New(store, idempotency.WithCodec(upperCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res, err := idempotency.Do(ctx, r, idempotency.Request{Key: "k"}, func(context.Context) ([]byte, error) {
			return []byte("x"), nil
		})
		if err != nil || string(res.Value) != "x" || res.Replayed != (i == 1) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	if got := storedResult(t, store, r, "k"); string(got) != `vU"eA=="` {
		t.Errorf("stored %q: the codec did not see the bytes", got)
	}
}
