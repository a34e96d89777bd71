package grpcidem

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestStoredForm(t *testing.T) {
	reply := wrapperspb.String("ch_1")
	b, ok := encodeAnswer(reply, status.New(codes.OK, ""), 1<<10)
	if !ok {
		t.Fatal("reply not encoded")
	}
	d, err := decodeAnswer(b)
	if err != nil || d.err != nil || !proto.Equal(d.reply, reply) {
		t.Fatalf("reply round trip: %v, %v", d, err)
	}

	st, _ := status.New(codes.NotFound, "no such account").WithDetails(&errdetails.ResourceInfo{ResourceName: "acct_1"})
	b, ok = encodeAnswer(nil, st, 1<<10)
	if !ok {
		t.Fatal("status not encoded")
	}
	d, err = decodeAnswer(b)
	if err != nil || !proto.Equal(status.Convert(d.err).Proto(), st.Proto()) {
		t.Fatalf("status round trip: %v, %v", d.err, err)
	}

	if _, ok := encodeAnswer(reply, status.New(codes.OK, ""), 8); ok {
		t.Error("an answer above the limit was encoded")
	}
	if _, ok := encodeAnswer("not a message", status.New(codes.OK, ""), 1<<10); ok {
		t.Error("a reply that is not a protocol buffer message was encoded")
	}
	if d, err := decodeAnswer(notStoredMarker); err != nil || !d.notStored {
		t.Errorf("marker: %v, %v", d, err)
	}

	good, _ := encodeAnswer(reply, status.New(codes.OK, ""), 1<<10)
	for name, bad := range map[string][]byte{
		"empty":             nil,
		"other version":     append([]byte{2}, good[1:]...),
		"truncated status":  {storedVersion, 0, 5, 1},
		"truncated name":    {storedVersion, 0, 0, 40, 'a'},
		"unregistered type": {storedVersion, 0, 0, 3, 'a', '.', 'B'},
		"OK status stored":  {storedVersion, 0, 2, 0x08, 0x00, 0},
		"broken reply":      append(good[:len(good):len(good)], 0xff),
	} {
		if _, err := decodeAnswer(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}
