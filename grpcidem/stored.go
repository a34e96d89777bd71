package grpcidem

import (
	"errors"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// The stored form of a call's answer, the bytes the executor stores.
// Version 1:
//
//	byte    version (1)
//	byte    flags: flagNotStored when only a marker was kept
//	uvarint length, then a google.rpc.Status (code, message, details);
//	        length 0 for OK
//	uvarint length, then the reply's full message name (OK only)
//	rest    the reply message, marshalled
//
// The reply is kept in its wire form, with its type's name, so that a
// replay rebuilds it through the registry of the generated code without
// the handler.
const (
	storedVersion = 1
	flagNotStored = 1
)

var errCorruptResponse = errors.New("grpcidem: stored response is corrupt")

// encodeAnswer returns the stored form of the handler's answer: reply if
// err is nil, else err's status. It reports false when the answer cannot
// be stored within limit bytes (or the reply is not a protocol buffer
// message); the caller stores [notStoredMarker] instead.
func encodeAnswer(reply any, st *status.Status, limit int) ([]byte, bool) {
	var stBytes, body []byte
	var name protoreflect.FullName
	if st.Code() != 0 {
		b, err := proto.Marshal(st.Proto())
		if err != nil {
			return nil, false
		}
		stBytes = b
	} else {
		m, ok := reply.(proto.Message)
		if !ok || m == nil {
			return nil, false
		}
		name = m.ProtoReflect().Descriptor().FullName()
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, false
		}
		body = b
	}
	size := 2 + protowire.SizeBytes(len(stBytes)) + protowire.SizeBytes(len(name)) + len(body)
	if size > limit {
		return nil, false
	}
	b := make([]byte, 0, size)
	b = append(b, storedVersion, 0)
	b = protowire.AppendBytes(b, stBytes)
	b = protowire.AppendString(b, string(name))
	return append(b, body...), true
}

// notStoredMarker is what is stored for an answer that could not be: the
// handler ran, so retries must not run it again, but get
// [ReasonResponseNotStored].
var notStoredMarker = []byte{storedVersion, flagNotStored, 0, 0}

// decoded is a stored answer.
type decoded struct {
	notStored bool
	err       error // the stored status, nil for OK
	reply     proto.Message
}

// decodeAnswer rebuilds a stored answer. The reply's type is looked up by
// name in the global registry, where generated code registers itself.
func decodeAnswer(b []byte) (decoded, error) {
	var d decoded
	if len(b) < 2 || b[0] != storedVersion {
		return d, errCorruptResponse
	}
	if b[1]&flagNotStored != 0 {
		d.notStored = true
		return d, nil
	}
	b = b[2:]
	stBytes, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return d, errCorruptResponse
	}
	b = b[n:]
	name, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return d, errCorruptResponse
	}
	body := b[n:]
	if len(stBytes) > 0 {
		var p spb.Status
		if err := proto.Unmarshal(stBytes, &p); err != nil || p.GetCode() == 0 {
			return d, errCorruptResponse
		}
		d.err = status.FromProto(&p).Err()
		return d, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return d, errors.New("grpcidem: stored reply of type " + string(name) + " is not registered: " + err.Error())
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(body, m); err != nil {
		return d, errCorruptResponse
	}
	d.reply = m
	return d, nil
}
