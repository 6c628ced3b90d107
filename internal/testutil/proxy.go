package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
)

// TCPProxy forwards the connections made to Addr to a target address until
// it is cut. A test makes a shared service (the test Postgres) unreachable
// for its own clients alone by pointing them at a proxy and cutting it:
// their open connections break and their new ones are refused, as when the
// server's host goes away.
type TCPProxy struct {
	// Addr is where the proxy listens, host:port on 127.0.0.1.
	Addr   string
	target string
	tb     testing.TB

	mu    sync.Mutex
	ln    net.Listener          // nil while cut
	conns map[net.Conn]struct{} // both ends of every forwarded connection
	wg    sync.WaitGroup        // the accept loop and the copies
}

// StartTCPProxy starts a proxy to target (host:port) on a free port of
// 127.0.0.1; it is cut when the test ends.
func StartTCPProxy(tb testing.TB, target string) *TCPProxy {
	tb.Helper()
	p := &TCPProxy{target: target, tb: tb, conns: map[net.Conn]struct{}{}}
	p.listen("127.0.0.1:0")
	p.Addr = p.ln.Addr().String()
	tb.Cleanup(p.Cut)
	return p
}

// Cut closes the listener and every connection forwarded, and waits for
// the proxy's goroutines to end: a dial to Addr is refused until Restore.
func (p *TCPProxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
	p.mu.Unlock()
	p.wg.Wait()
}

// Restore listens on Addr again, after Cut.
func (p *TCPProxy) Restore() {
	p.tb.Helper()
	p.listen(p.Addr)
}

func (p *TCPProxy) listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.tb.Fatalf("proxy: listen on %s: %v", addr, err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // cut
			}
			p.forward(c)
		}
	})
}

// forward connects c to the target and copies both ways until either
// side closes or the proxy is cut.
func (p *TCPProxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
		return
	}
	p.conns[c], p.conns[s] = struct{}{}, struct{}{}
	p.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	p.wg.Go(func() { pipe(s, c) })
	p.wg.Go(func() { pipe(c, s) })
}
