package redis

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/exactlyonce/idempotency"
)

// TestEncodeFingerprint: the stored form is one-to-one (different
// fingerprints never share one, even when they name the same digest in
// another case) and short for the idempotency package's fingerprints.
func TestEncodeFingerprint(t *testing.T) {
	sum := idempotency.FingerprintBytes([]byte("body"))
	hexpart := strings.TrimPrefix(string(sum), "sha256:")
	fps := []idempotency.Fingerprint{
		"", "fp", sum,
		idempotency.Fingerprint("sha256:" + strings.ToUpper(hexpart)),
		idempotency.Fingerprint("sha256:" + hexpart[:63] + "g"),
		idempotency.Fingerprint("sha256:" + hexpart + "0"),
		idempotency.Fingerprint("h" + hexpart[:32]),
		idempotency.Fingerprint("=" + string(sum)),
		idempotency.FingerprintBytes([]byte("other")),
	}
	seen := map[string]idempotency.Fingerprint{}
	for _, fp := range fps {
		e := encodeFingerprint(fp)
		if prev, ok := seen[e]; ok {
			t.Errorf("%q and %q share the stored form %q", prev, fp, e)
		}
		seen[e] = fp
		if encodeFingerprint(fp) != e {
			t.Errorf("%q: unstable", fp)
		}
	}
	if e := encodeFingerprint(sum); len(e) != 33 || e[0] != 'h' {
		t.Errorf("sha256 fingerprint stored as %d bytes %q, want 33 starting with h", len(e), e)
	}
}

// TestDecodeFingerprint: Inspect and Stuck give back the fingerprint as
// it was claimed, whichever stored form it took.
func TestDecodeFingerprint(t *testing.T) {
	for _, fp := range []idempotency.Fingerprint{
		"", "fp", idempotency.FingerprintBytes([]byte("body")),
		idempotency.Fingerprint("sha256:" + strings.Repeat("A", 64)),
		idempotency.Fingerprint("h" + strings.Repeat("x", 32)),
	} {
		got, err := decodeFingerprint(encodeFingerprint(fp))
		if err != nil || got != fp {
			t.Errorf("%q: decoded %q, %v", fp, got, err)
		}
	}
	for _, bad := range []string{"", "x", "h" + strings.Repeat("x", 31)} {
		if _, err := decodeFingerprint(bad); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
}

// TestShardsEven: storage keys that differ only at the end (the usual
// case: one tenant, numbered orders) spread evenly over the 1024 shards.
// A chi-square statistic over 1023 degrees of freedom has mean 1023 and
// standard deviation 45; FNV-1a's top bits without the finalizer score
// about 70,000 on these keys.
func TestShardsEven(t *testing.T) {
	for _, format := range []string{"9:tenant-42:order-%d", "%d", "6:tenant3:k%d"} {
		const n = 204_800
		var counts [Shards]int
		for i := range n {
			counts[shardOf(fmt.Sprintf(format, i))]++
		}
		want := float64(n) / Shards
		chi2 := 0.0
		for _, c := range counts {
			chi2 += (float64(c) - want) * (float64(c) - want) / want
		}
		t.Logf("%q: chi-square %.0f, min %d, max %d (expected %.0f a shard)", format, chi2, slices.Min(counts[:]), slices.Max(counts[:]), want)
		if chi2 > 1023+6*45 {
			t.Errorf("%q: keys crowd into some shards: chi-square %.0f", format, chi2)
		}
	}
}
