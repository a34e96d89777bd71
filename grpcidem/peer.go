package grpcidem

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// PeerScope is a [ScopeFunc] for services that authenticate their
// clients with mutual TLS: it scopes each call by the verified client
// certificate's identity and the full method. The identity is the
// certificate's first URI SAN (a SPIFFE ID such as
// spiffe://example.org/billing) or, without one, its subject's
// distinguished name. A call without a client certificate verified by the
// server's TLS configuration (ClientAuth VerifyClientCertIfGiven or
// RequireAndVerifyClientCert) is rejected with Unauthenticated before
// anything is claimed: a peer that cannot be told apart must not share a
// key space with others.
//
//	idem, err := grpcidem.UnaryServerInterceptor(runner, grpcidem.WithScope(grpcidem.PeerScope))
func PeerScope(ctx context.Context, fullMethod string) ([]string, error) {
	id, ok := PeerIdentity(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "this method requires a verified client certificate")
	}
	return []string{id, fullMethod}, nil
}

// PeerIdentity returns the identity of the call's peer as [PeerScope]
// takes it: the first URI SAN of its verified TLS client certificate, or
// else its subject. It reports false when the call has no verified
// client certificate.
func PeerIdentity(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := info.State.VerifiedChains[0][0]
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String(), true
	}
	if s := leaf.Subject.String(); s != "" {
		return s, true
	}
	return "", false
}
