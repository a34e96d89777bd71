package grpcidem_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	"github.com/exactlyonce/idempotency/grpcidem"
	"github.com/exactlyonce/idempotency/grpcidem/internal/testpb"
)

// issue makes a certificate signed by parent (self-signed when parent is
// nil) and returns it with its key.
func issue(t *testing.T, tmpl *x509.Certificate, parent *tls.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// Scope by the verified client certificate (mutual TLS): two clients
// with one key get their own answers, a client without a certificate is
// refused.
func TestPeerScope(t *testing.T) {
	ca := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}, nil)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Leaf)
	server := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "server"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &ca)
	spiffe, _ := url.Parse("spiffe://example.org/billing")
	clientA := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "a"}, URIs: []*url.URL{spiffe},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)
	clientB := issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "b", Organization: []string{"shop"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, &ca)

	idem, err := grpcidem.UnaryServerInterceptor(newRunner(t, nil), grpcidem.WithScope(grpcidem.PeerScope))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ids []string
	p := &payments{hook: func(ctx context.Context, _ *testpb.PayRequest) error {
		id, _ := grpcidem.PeerIdentity(ctx)
		mu.Lock()
		ids = append(ids, id)
		mu.Unlock()
		return nil
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{server}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven,
	})), grpc.UnaryInterceptor(idem))
	testpb.RegisterPaymentsServer(srv, p)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	client := func(certs ...tls.Certificate) testpb.PaymentsClient {
		cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(
			credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: certs, ServerName: "127.0.0.1"})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return testpb.NewPaymentsClient(cc)
	}
	a, b, anonymous := client(clientA), client(clientB), client()
	req := &testpb.PayRequest{Amount: 1}
	ra, errA := a.Pay(keyed("k"), req)
	rb, errB := b.Pay(keyed("k"), req)
	again, errAgain := a.Pay(keyed("k"), req)
	if errA != nil || errB != nil || errAgain != nil || ra.GetChargeId() == rb.GetChargeId() || again.GetChargeId() != ra.GetChargeId() {
		t.Fatalf("a %v %v, b %v %v, a again %v %v; want a and b apart, a replayed", ra, errA, rb, errB, again, errAgain)
	}
	mu.Lock()
	ids = append([]string(nil), ids...)
	mu.Unlock()
	if len(ids) != 2 || ids[0] != "spiffe://example.org/billing" || ids[1] != "CN=b,O=shop" {
		t.Fatalf("identities %q", ids)
	}
	_, err = anonymous.Pay(keyed("k"), req)
	wantErr(t, err, codes.Unauthenticated, grpcidem.ReasonScopeRejected)
	if p.runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", p.runs.Load())
	}
}
