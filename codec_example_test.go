package idempotency_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/store/memory"
)

// sealedCodec encrypts what is stored with AES-GCM, so results (card
// fingerprints, account numbers) rest in the store encrypted.
type sealedCodec struct {
	aead  cipher.AEAD
	inner idempotency.Codec
}

func (c sealedCodec) Marshal(v any) ([]byte, error) {
	plain, err := c.inner.Marshal(v)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, c.aead.NonceSize(), c.aead.NonceSize()+len(plain)+c.aead.Overhead())
	rand.Read(nonce)
	return c.aead.Seal(nonce, nonce, plain, nil), nil
}

func (c sealedCodec) Unmarshal(data []byte, v any) error {
	n := c.aead.NonceSize()
	if len(data) < n {
		return errors.New("sealed value too short")
	}
	plain, err := c.aead.Open(nil, data[:n], data[n:], nil)
	if err != nil {
		return err
	}
	return c.inner.Unmarshal(plain, v)
}

// A codec can encrypt (or redact) everything that is stored: results,
// recovery points and stored error messages.
func ExampleWithCodec() {
	key := make([]byte, 32) // from your key management, not zeros
	block, _ := aes.NewCipher(key)
	aead, _ := cipher.NewGCM(block)
	store, _ := memory.New(nil)
	r, _ := idempotency.New(store, idempotency.WithCodec(sealedCodec{aead: aead, inner: idempotency.JSONCodec{}}))

	ctx := context.Background()
	req := idempotency.Request{Key: "order-11"}
	for range 2 {
		res, err := idempotency.Do(ctx, r, req, func(ctx context.Context) (string, error) {
			return "iban DE89 3704 0044 0532 0130 00", nil
		})
		fmt.Println(res.Value, res.Replayed, err)
	}
	// Output:
	// iban DE89 3704 0044 0532 0130 00 false <nil>
	// iban DE89 3704 0044 0532 0130 00 true <nil>
}

// spyStore records every result handed to Complete.
type spyStore struct {
	idempotency.Store
	results [][]byte
}

func (s *spyStore) Complete(ctx context.Context, key string, tok idempotency.Token, result []byte, ret time.Duration) error {
	s.results = append(s.results, append([]byte(nil), result...))
	return s.Store.Complete(ctx, key, tok, result, ret)
}

func TestCodecSealsStoredBytes(t *testing.T) {
	block, _ := aes.NewCipher(make([]byte, 32))
	aead, _ := cipher.NewGCM(block)
	spy := &spyStore{Store: memStore(nil)}
	r, err := idempotency.New(spy, idempotency.WithCodec(sealedCodec{aead: aead, inner: idempotency.JSONCodec{}}))
	if err != nil {
		t.Fatal(err)
	}
	const secret = "iban DE89 3704 0044 0532 0130 00"
	ctx := context.Background()
	idempotency.Do(ctx, r, idempotency.Request{Key: "v"}, func(ctx context.Context) (string, error) { return secret, nil })
	idempotency.Do(ctx, r, idempotency.Request{Key: "e"}, func(ctx context.Context) (string, error) {
		return "", idempotency.Permanent(errors.New(secret))
	})
	if len(spy.results) != 2 {
		t.Fatalf("%d results stored", len(spy.results))
	}
	for _, b := range spy.results {
		if bytes.Contains(b, []byte("DE89")) {
			t.Fatalf("stored bytes hold the plaintext: %q", b)
		}
	}
	_, err = idempotency.Do(ctx, r, idempotency.Request{Key: "e"}, func(ctx context.Context) (string, error) { return "", nil })
	if err == nil || err.Error() != secret {
		t.Fatalf("replayed error %v, want the decrypted message", err)
	}
}
