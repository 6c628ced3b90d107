package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/wire"
)

// shortLimits are connection limits small enough for a test to cross them
// in a fraction of a second.
var shortLimits = ServerOptions{
	ReadHeaderTimeout: time.Second,
	IdleTimeout:       300 * time.Millisecond,
	WriteTimeout:      200 * time.Millisecond,
	BodyMinRate:       1000,
	BodyGrace:         100 * time.Millisecond,
	BodyStall:         time.Second,
}

// serveLimited serves h on a loopback listener behind NewHTTPServer(o).
func serveLimited(t *testing.T, o ServerOptions, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(h, o)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// readsJSON answers a JSON body with its size, or its error as the API does.
func readsJSON(w http.ResponseWriter, r *http.Request) {
	var v map[string]any
	body, err := decodeJSON(w, r, 1<<20, &v, false)
	if err != nil {
		writeError(w, r, slog.New(slog.DiscardHandler), err, wire.WriteError)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"bytes": len(body)})
}

// post writes a request's headers for a body of n bytes to c.
func post(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "POST /v1/jobs HTTP/1.1\r\nHost: llmq\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", n); err != nil {
		t.Fatal(err)
	}
}

// jsonBody is a JSON object of exactly n bytes.
func jsonBody(n int) []byte {
	return []byte(`{"p":"` + strings.Repeat("x", n-8) + `"}`)
}

// A body sent a byte at a time (the slowloris of the issue: a byte every
// 2 s was still read after 30 s) is cut once it falls behind the minimum
// rate, with a 408 in the API's error shape, long before it is complete.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits, http.HandlerFunc(readsJSON))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 5000
	post(t, c, size)
	body := jsonBody(size)
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < size; n++ {
			if _, err := c.Write(body[n : n+1]); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond) // 50 bytes/s, a twentieth of the minimum
			if n == 200 {
				break // 4 s in: the server should have answered long before
			}
		}
		sent <- n
	}()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Code    client.Code
			Message string
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusRequestTimeout || e.Error.Code != client.CodeRequestTimeout {
		t.Fatalf("answer %d %+v; want 408 request_timeout", resp.StatusCode, e)
	}
	_ = c.Close()
	if n := <-sent; n >= 200 {
		t.Fatalf("the server read %d bytes of a trickling body before cutting it", n)
	}
}

// A body that keeps above the minimum rate is read whole even when it takes
// longer than WriteTimeout: the response's deadline counts from the body's
// end, so a long upload on a slow link is not cut.
func TestBodyAboveTheMinimumRateIsRead(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits, http.HandlerFunc(readsJSON))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 5000
	post(t, c, size)
	body := jsonBody(size)
	start := time.Now()
	for i := 0; i < size; i += 100 { // 100 bytes per 10 ms: ten times the minimum
		if _, err := c.Write(body[i:min(i+100, size)]); err != nil {
			t.Fatalf("the server stopped reading after %d bytes: %v", i, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]int
	_ = json.NewDecoder(resp.Body).Decode(&got)
	if resp.StatusCode != http.StatusOK || got["bytes"] != size {
		t.Fatalf("answer %d %v; want 200 with %d bytes", resp.StatusCode, got, size)
	}
	if took < shortLimits.WriteTimeout {
		t.Fatalf("the body took %v, less than WriteTimeout %v: the test proves nothing", took, shortLimits.WriteTimeout)
	}
}

// A keep-alive connection that sends no next request is closed after
// IdleTimeout; before, an idle connection was never closed.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for range 2 { // the connection is kept alive between requests
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: llmq\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			t.Fatal("the server closes after each request: nothing to test")
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle keep-alive: read = %v, want the server to close it (EOF)", err)
	}
}

// A response that streams (a file download, server-sent events) is not cut
// by WriteTimeout when written through streamTo; written directly, the
// same response is cut once WriteTimeout has passed.
func TestStreamedResponseHasADeadlinePerWrite(t *testing.T) {
	t.Parallel()
	chunk := bytes.Repeat([]byte("x"), 64<<10) // past the server's buffer: each write reaches the socket
	stream := func(streamed bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			out := io.Writer(w)
			if streamed {
				out = streamTo(w, r)
			}
			for range 5 { // 5 × 100 ms: more than twice WriteTimeout
				if _, err := out.Write(chunk); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	for _, streamed := range []bool{true, false} {
		addr := serveLimited(t, shortLimits, stream(streamed))
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if streamed && (err != nil || n != 5*int64(len(chunk))) {
			t.Errorf("through streamTo: read %d bytes, %v; want all %d", n, err, 5*len(chunk))
		}
		if !streamed && n == 5*int64(len(chunk)) {
			t.Errorf("written directly: all %d bytes arrived; want the response cut at WriteTimeout", n)
		}
	}
}

// The deadlines are the connection's: a request without NewHTTPServer's
// deadlines (the handler served another way) streams to w itself.
func TestStreamToWithoutTheServersDeadlines(t *testing.T) {
	t.Parallel()
	r, _ := http.NewRequest("GET", "/", nil)
	var w http.ResponseWriter = nopWriter{}
	if got := streamTo(w, r); got != io.Writer(w) {
		t.Fatalf("streamTo = %T, want w", got)
	}
}

type nopWriter struct{}

func (nopWriter) Header() http.Header         { return http.Header{} }
func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriter) WriteHeader(int)             {}
