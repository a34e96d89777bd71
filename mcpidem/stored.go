package mcpidem

import (
	"encoding/json"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The stored form of a call's result, the bytes the executor stores.
// Version 1:
//
//	byte    version (1)
//	byte    flags: flagNotStored when only a marker was kept
//	rest    the CallToolResult as JSON, as the SDK marshals it (empty
//	        with flagNotStored)
//
// The result is kept as it was sent, so that a replay sends the same
// JSON, with the replay mark added to its _meta.
const (
	storedVersion = 1
	flagNotStored = 1
)

var errCorruptResult = errors.New("mcpidem: stored result is corrupt")

// notStoredMarker is what is stored for a result that could not be: the
// tool ran, so retries must not run it again, but get
// [CodeResponseNotStored].
var notStoredMarker = []byte{storedVersion, flagNotStored}

// encodeResult returns the stored form of res, or false when it cannot be
// stored within limit bytes; the caller stores [notStoredMarker] instead.
func encodeResult(res *mcp.CallToolResult, limit int) ([]byte, bool) {
	b, err := json.Marshal(res)
	if err != nil || 2+len(b) > limit {
		return nil, false
	}
	out := make([]byte, 0, 2+len(b))
	out = append(out, storedVersion, 0)
	return append(out, b...), true
}

// decodeResult rebuilds a stored result; notStored reports the marker.
func decodeResult(b []byte) (res *mcp.CallToolResult, notStored bool, err error) {
	if len(b) < 2 || b[0] != storedVersion {
		return nil, false, errCorruptResult
	}
	if b[1]&flagNotStored != 0 {
		return nil, true, nil
	}
	res = new(mcp.CallToolResult)
	if err := json.Unmarshal(b[2:], res); err != nil {
		return nil, false, errCorruptResult
	}
	return res, false, nil
}
