package redis

import (
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
