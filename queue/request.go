package queue

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// notStoredHeaders are the request headers Enqueue leaves out: hop-by-hop
// headers belong to one connection (RFC 9110 §7.6.1), and the framing is
// recomputed by every attempt.
var notStoredHeaders = map[string]bool{
	"Connection":        true,
	"Keep-Alive":        true,
	"Proxy-Connection":  true,
	"Te":                true,
	"Trailer":           true,
	"Transfer-Encoding": true,
	"Upgrade":           true,
	"Content-Length":    true,
}

// hostHeader carries a request's Host, when it differs from its URL's, in
// the stored header; it is given back to Request.Host on every attempt.
const hostHeader = "Host"

// prepareRequest checks req and returns what Enqueue stores of it.
func (q *Queue) prepareRequest(req *http.Request) (*head, *body, error) {
	c := &q.cfg
	if req == nil {
		return nil, nil, invalidArg("nil request")
	}
	if req.Method == "" {
		return nil, nil, invalidArg("the request has no method (net/http takes it as GET, which needs no key); give one of %s", strings.Join(c.methods, ", "))
	}
	if !slices.Contains(c.methods, req.Method) {
		return nil, nil, invalidArg("method %s: the queue takes requests whose method needs a key: %s (WithMethods)", req.Method, strings.Join(c.methods, ", "))
	}
	u, err := checkURL(req.URL)
	if err != nil {
		return nil, nil, err
	}
	if len(req.Header.Values(c.keyHeader)) > 0 {
		return nil, nil, invalidArg("the request already has a %s header: Enqueue makes the key", c.keyHeader)
	}
	if len(req.Trailer) > 0 {
		return nil, nil, invalidArg("the request has trailers, which the queue does not store")
	}
	data, err := replayableBody(req, c.maxBody)
	if err != nil {
		return nil, nil, err
	}
	h := make(http.Header, len(req.Header)+1)
	for name, vs := range req.Header {
		if !notStoredHeaders[http.CanonicalHeaderKey(name)] {
			h[name] = slices.Clone(vs)
		}
	}
	if req.Host != "" && req.Host != req.URL.Host {
		h[hostHeader] = []string{req.Host}
	}
	return &head{method: req.Method, url: u}, &body{header: h, data: data}, nil
}

// checkURL checks that u is an absolute http or https URL with a host,
// and returns its text, which must parse back to the same URL.
func checkURL(u *url.URL) (string, error) {
	if u == nil {
		return "", invalidArg("the request has no URL")
	}
	s := u.String()
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", invalidArg("URL %q: not http or https, so no server could be reached", s)
	case u.Host == "" || u.Opaque != "":
		return "", invalidArg("URL %q: no host", s)
	case u.User != nil:
		return "", invalidArg("URL %q: credentials in the URL would be stored; give them in WithPrepare", u.Redacted())
	}
	back, err := url.Parse(s)
	if err != nil {
		return "", invalidArg("URL %q: %v", s, err)
	}
	if back.Hostname() == "" {
		return "", invalidArg("URL %q: no host", s)
	}
	if p := back.Port(); p != "" {
		for _, c := range p {
			if c < '0' || c > '9' {
				return "", invalidArg("URL %q: invalid port", s)
			}
		}
	}
	return s, nil
}

// replayableBody reads a copy of req's body through GetBody, leaving
// req.Body unread, or refuses a body that cannot be read again.
func replayableBody(req *http.Request, limit int64) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody == nil {
		return nil, invalidArg("the request's body cannot be read again (a stream: no GetBody); " +
			"give a *bytes.Reader, *bytes.Buffer or *strings.Reader to http.NewRequest, or set GetBody")
	}
	if req.ContentLength > limit {
		return nil, invalidArg("the request's body has %d bytes, more than the limit of %d (WithMaxBodySize)", req.ContentLength, limit)
	}
	rc, err := req.GetBody()
	if err != nil {
		return nil, invalidArg("the request's GetBody failed: %v", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, invalidArg("reading the request's body: %v", err)
	}
	if int64(len(data)) > limit {
		return nil, invalidArg("the request's body is larger than the limit of %d bytes (WithMaxBodySize)", limit)
	}
	if req.ContentLength > 0 && int64(len(data)) != req.ContentLength {
		return nil, invalidArg("the request's body has %d bytes, its ContentLength says %d", len(data), req.ContentLength)
	}
	return data, nil
}

// newRequest makes an attempt's request of a stored item.
func (q *Queue) newRequest(ctx context.Context, key string, h *head, b *body) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, h.method, h.url, bytes.NewReader(b.data))
	if err != nil {
		return nil, err
	}
	if len(b.data) == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	for name, vs := range b.header {
		if name == hostHeader {
			req.Host = vs[0]
			continue
		}
		req.Header[name] = vs
	}
	req.Header.Set(q.cfg.keyHeader, key)
	return req, nil
}
