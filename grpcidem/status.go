package grpcidem

import (
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/exactlyonce/idempotency/internal/edge"
)

// ErrorDomain is the Domain of the [errdetails.ErrorInfo] attached to
// every error the server interceptor answers by itself; its Reason is one
// of the Reason* constants. Clients should branch on the reason (see
// [ReasonOf]), not on the message.
const ErrorDomain = "idempotency.exactlyonce.github.com"

// The reasons of the interceptor's own errors, the counterparts of the
// HTTP middleware's problem types.
const (
	// ReasonKeyMissing (InvalidArgument): the method requires an
	// idempotency key and the call has none. Send one, made once per user
	// intent.
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyMalformed (InvalidArgument): the key metadata is repeated,
	// or the key breaks the length, character or validator rules.
	ReasonKeyMalformed = "IDEMPOTENCY_KEY_MALFORMED"
	// ReasonBadRequest (InvalidArgument): the request could not be
	// fingerprinted. Nothing was claimed.
	ReasonBadRequest = "IDEMPOTENCY_BAD_REQUEST"
	// ReasonInProgress (Aborted, with an [errdetails.RetryInfo]): a call
	// with the same key is being processed. Retry after the delay, with
	// the same key: the retry gets its response.
	ReasonInProgress = "IDEMPOTENCY_IN_PROGRESS"
	// ReasonKeyReused (FailedPrecondition): the key was used before with
	// a different request (method or message). The first response is
	// never given for another request; use a new key for a new intent.
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonResponseNotStored (FailedPrecondition, marked replayed): the
	// call with this key was processed (its effect happened), but its
	// response could not be stored, so it cannot be replayed, and the
	// call is not run again.
	ReasonResponseNotStored = "IDEMPOTENCY_RESPONSE_NOT_STORED"
	// ReasonStoreUnavailable (Unavailable, with an [errdetails.RetryInfo]):
	// the idempotency store could not be reached, so the call was not
	// processed. Retry with the same key.
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonScopeRejected (PermissionDenied): the call's scope (tenant,
	// peer) could not be established, so its key cannot be used. Nothing
	// was claimed and the handler did not run.
	ReasonScopeRejected = "IDEMPOTENCY_SCOPE_REJECTED"
	// ReasonResultCorrupt (DataLoss): the stored answer of this key cannot
	// be read (written by another version or codec, or damaged). The call
	// is not run again, and a retry cannot help: an operator must inspect
	// the record.
	ReasonResultCorrupt = "IDEMPOTENCY_RESULT_CORRUPT"
	// ReasonInternal (Internal): the call failed in a way the interceptor
	// cannot classify.
	ReasonInternal = "IDEMPOTENCY_INTERNAL"
)

// Stored reports whether the server interceptor stores a handler's
// answer with this code, to replay it to every retry. The rule follows
// the HTTP middleware's (2xx to 4xx stored, except 408 and 429), through
// the usual mapping of codes to HTTP statuses, with one exception:
//
//   - stored: OK, InvalidArgument, NotFound, AlreadyExists,
//     PermissionDenied, FailedPrecondition, OutOfRange: the answer is the
//     outcome of this request, and a retry must get it again;
//   - not stored, the key is released so that a retry runs the handler
//     again: Canceled, Unknown (a handler's plain Go error), DeadlineExceeded,
//     ResourceExhausted, Aborted, Unimplemented, Internal, Unavailable,
//     DataLoss (the 5xx, 408 and 429 of HTTP, and Aborted, which gRPC
//     defines as "retry at a higher level"), and Unauthenticated: unlike
//     HTTP's 401, which is stored, because a client that refreshes an
//     expired credential retries the same intent with the same key and
//     must not get the old failure for the whole retention.
func Stored(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
		codes.PermissionDenied, codes.FailedPrecondition, codes.OutOfRange:
		return true
	}
	return false
}

// ErrTransient is the error the interceptor's function returns to the
// executor when the handler failed with a code that [Stored] does not
// store, so that the key is released and a retry runs the handler again.
// It is transient under the runner's default error policy; a custom
// policy ([idempotency.WithErrorPolicy]) must keep it transient, or such
// failures would be replayed for the whole retention. It is the same
// error as httpidem's ErrTransient.
var ErrTransient = edge.ErrTransient

// leaseMetadata is the key of the [errdetails.ErrorInfo] metadata that
// tells, on an answer of reason [ReasonInProgress], the time left on the
// holder's lease in milliseconds (see [LeaseRemaining]).
const leaseMetadata = "lease_remaining_ms"

// newStatus makes the interceptor's own status: the code and message, an
// ErrorInfo with the reason (and, when lease > 0, the holder's lease time
// left) and, when retry > 0, a RetryInfo.
func newStatus(c codes.Code, reason, msg string, retry, lease time.Duration) *status.Status {
	st := status.New(c, msg)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}
	if lease > 0 {
		info.Metadata = map[string]string{leaseMetadata: strconv.FormatInt(lease.Milliseconds(), 10)}
	}
	details := []protoadapt.MessageV1{info}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st
}

// withReason returns st with an ErrorInfo of the reason added, unless it
// has one of [ErrorDomain] already.
func withReason(st *status.Status, reason string) *status.Status {
	if reasonOf(st) != "" {
		return st
	}
	if withDetails, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}); err == nil {
		return withDetails
	}
	return st
}

// errorInfo returns st's ErrorInfo of [ErrorDomain], or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info
		}
	}
	return nil
}

func reasonOf(st *status.Status) string { return errorInfo(st).GetReason() }

// ReasonOf returns the reason of an error the server interceptor answered
// by itself (one of the Reason* constants), or "" for any other error,
// such as the handler's own.
func ReasonOf(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	return reasonOf(st)
}

// LeaseRemaining returns, for an error of reason [ReasonInProgress], the
// time left on the lease of the call that holds the key, as the store
// judged it when the error was made, and whether err tells it. Once it
// has passed, a retry takes over the key of a holder that crashed; the
// client interceptor follows it ([WithMaxLeaseWait]).
func LeaseRemaining(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	ms, perr := strconv.ParseInt(errorInfo(st).GetMetadata()[leaseMetadata], 10, 64)
	if perr != nil || ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// RetryDelay returns the delay of the first [errdetails.RetryInfo] in
// err's status, and whether it has one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if d := ri.GetRetryDelay(); d.IsValid() {
				return max(d.AsDuration(), 0), true
			}
		}
	}
	return 0, false
}
