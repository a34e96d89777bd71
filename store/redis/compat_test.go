package redis_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemredis "github.com/exactlyonce/idempotency/store/redis"
	goredis "github.com/redis/go-redis/v9"
)

// writeOldStarted writes, as the previous release's claim and checkpoint
// scripts did, a STARTED record held by tok under key: fields f s t n a l
// g and one checkpoint "c:step", without the fields m and c of this
// release; its index entry; and its fence's high-water mark. The lease
// ends leaseLeft from the server's now; the record lives 10 minutes.
func writeOldStarted(t *testing.T, c *goredis.Client, s *idemredis.Store, key, tok string, fence int64, leaseLeft time.Duration) {
	t.Helper()
	ctx := context.Background()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline := now.Add(leaseLeft).UnixMilli()
	rk := s.Key(key)
	idx := rk[:len(rk)-len(key)] + "\x00started"
	_, err = c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.HSet(ctx, rk, "f", "=fp", "s", "started", "t", tok, "n", strconv.FormatInt(fence, 10),
			"a", "1", "l", strconv.FormatInt(deadline, 10), "g", "60000", "c:step", "v")
		p.PExpire(ctx, rk, 10*time.Minute)
		p.ZAdd(ctx, idx, goredis.Z{Score: float64(deadline), Member: key})
		p.PExpire(ctx, idx, 11*time.Minute)
		p.Set(ctx, idemredis.FenceKey(s, key), fence, time.Hour)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// fieldNames returns the sorted field names of a record.
func fieldNames(t *testing.T, c *goredis.Client, k string) []string {
	t.Helper()
	m, err := c.HGetAll(context.Background(), k).Result()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(m))
}

// TestRecordsOfThePreviousRelease: records written in the previous
// release's layout (no fields m and c, checkpoints present) are read and
// carried on by this release's scripts: completed by their holder (the
// checkpoints and lease fields go), taken over (the checkpoints are handed
// over, then dropped by the completion), renewed (the fence's mark still
// outlives the record), and a completed one is replayed. Records of this
// release, with and without checkpoints, complete to the same fields.
func TestRecordsOfThePreviousRelease(t *testing.T) {
	c := newSingle(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	completed := []string{"a", "f", "n", "r", "s", "t"}

	t.Run("complete", func(t *testing.T) {
		const key = "7:old-complete"
		writeOldStarted(t, c, s, key, "a", 1000, time.Minute)
		if err := s.Complete(ctx, key, "a", []byte("res"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := fieldNames(t, c, s.Key(key)); !slices.Equal(got, completed) {
			t.Errorf("completed record has fields %q, want %q", got, completed)
		}
		res := mustClaim(t, s, claimReq(key, "x", time.Minute), idempotency.OutcomeReplay)
		if string(res.Result) != "res" || res.Fence != 1000 || res.Attempt != 1 {
			t.Errorf("replay: %+v", res)
		}
		info, err := s.Inspect(ctx, key)
		if err != nil || info.State != idempotency.StateCompleted || info.Checkpoints != nil {
			t.Errorf("Inspect: %+v, %v", info, err)
		}
	})

	t.Run("takeover", func(t *testing.T) {
		const key = "7:old-takeover"
		writeOldStarted(t, c, s, key, "a", 1000, -time.Second)
		res := mustClaim(t, s, claimReq(key, "b", time.Minute), idempotency.OutcomeAcquired)
		if res.Attempt != 2 || res.Fence <= 1000 || string(res.Checkpoints["step"]) != "v" || len(res.Checkpoints) != 1 {
			t.Fatalf("takeover: %+v", res)
		}
		if err := s.Complete(ctx, key, "b", []byte("res"), time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := fieldNames(t, c, s.Key(key)); !slices.Equal(got, completed) {
			t.Errorf("completed record has fields %q, want %q", got, completed)
		}
	})

	t.Run("renew", func(t *testing.T) {
		const key = "7:old-renew"
		writeOldStarted(t, c, s, key, "a", 1000, time.Minute)
		if err := s.Renew(ctx, key, "a", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		rec, err1 := c.PTTL(ctx, s.Key(key)).Result()
		hw, err2 := c.PTTL(ctx, idemredis.FenceKey(s, key)).Result()
		if err1 != nil || err2 != nil || hw < rec+idemredis.DefaultFenceMemory-time.Second {
			t.Errorf("after Renew the mark lives %v (%v), the record %v (%v)", hw, err2, rec, err1)
		}
		if v, err := c.Get(ctx, idemredis.FenceKey(s, key)).Int64(); err != nil || v != 1000 {
			t.Errorf("mark %d (%v), want 1000", v, err)
		}
	})

	t.Run("this release", func(t *testing.T) {
		for _, checkpoint := range []bool{false, true} {
			key := "7:new-" + strconv.FormatBool(checkpoint)
			mustClaim(t, s, claimReq(key, "a", time.Minute), idempotency.OutcomeAcquired)
			if checkpoint {
				if err := s.Checkpoint(ctx, key, "a", "step", []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Complete(ctx, key, "a", []byte("res"), time.Hour); err != nil {
				t.Fatal(err)
			}
			if got := fieldNames(t, c, s.Key(key)); !slices.Equal(got, completed) {
				t.Errorf("checkpoint %v: completed record has fields %q, want %q", checkpoint, got, completed)
			}
		}
	})

	t.Run("replay", func(t *testing.T) {
		const key = "7:old-completed"
		rk := s.Key(key)
		if err := c.HSet(ctx, rk, "f", "=fp", "s", "completed", "t", "a", "n", "1000", "a", "1", "r", "res").Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpire(ctx, rk, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		res := mustClaim(t, s, claimReq(key, "x", time.Minute), idempotency.OutcomeReplay)
		if string(res.Result) != "res" || res.Fence != 1000 {
			t.Errorf("replay: %+v", res)
		}
	})
}
