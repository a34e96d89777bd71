package etcd_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a TCP proxy in front of the real server, to make it hang (a
// member that accepts connections and never answers) or to lose replies
// after the server has applied a request.
type proxy struct {
	ln       net.Listener
	upstream string
	// hang: bytes are no longer forwarded either way; connections stay open.
	hang atomic.Bool
	// dropReplies: the next reply is discarded and every connection cut.
	dropReplies atomic.Bool

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(u, c, false) })
		p.wg.Go(func() { p.pipe(c, u, true) })
	}
}

// pipe copies from src to dst until either closes; reply is set for the
// server-to-client direction.
func (p *proxy) pipe(dst, src net.Conn, reply bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.hang.Load() {
				_, _ = io.Copy(io.Discard, src) // swallow everything, answer nothing
				return
			}
			if reply && p.dropReplies.CompareAndSwap(true, false) {
				p.cutAll()
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cutAll closes every connection through the proxy.
func (p *proxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) Close() {
	p.ln.Close()
	p.cutAll()
	p.wg.Wait()
}
