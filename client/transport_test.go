package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
)

// These tests use a stand-in server where they need answers a real llmq
// gives only by chance (a 429 on the n-th call, a proxy's HTML page) or must
// watch the wire (how an upload is sent).

// stubServer is a stand-in server.
type stubServer struct {
	URL   string
	calls atomic.Int32
	// mu is held while a handler runs; a test takes it to read what the
	// handler recorded, since the race detector does not see the socket
	// between handler and client as ordering them.
	mu sync.Mutex
}

// stub serves h, one call at a time, and counts its calls.
func stub(t *testing.T, h func(n int, w http.ResponseWriter, r *http.Request)) *stubServer {
	s := &stubServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		h(int(s.calls.Add(1)), w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// locked runs f under the handler lock.
func (s *stubServer) locked(f func()) { s.mu.Lock(); defer s.mu.Unlock(); f() }

func tooMany(w http.ResponseWriter, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded","param":null}}`)
}

const usageJSON = `{"object":"usage","tenant":"ten_1","tier":"standard","day":"2026-01-02","spent_usd":1.5,"reserved_usd":0,"budget_usd":50,"remaining_usd":48.5,"soft_limit_reached":false,"resets_at":1}`

func TestRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n <= 2 {
			tooMany(w, "0.05")
			return
		}
		fmt.Fprint(w, usageJSON)
	})
	c := newClient(t, s.URL, "k")
	start := time.Now()
	u, err := c.Usage(context.Background())
	if err != nil || u.SpentUSD != 1.5 {
		t.Fatalf("Usage = %+v, %v", u, err)
	}
	if s.calls.Load() != 3 || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("%d calls in %v; want 3, after two waits of 50ms", s.calls.Load(), time.Since(start))
	}
}

func TestRetryBounds(t *testing.T) {
	t.Parallel()
	t.Run("long Retry-After is returned at once", func(t *testing.T) {
		t.Parallel()
		s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) { tooMany(w, "3600") })
		_, err := newClient(t, s.URL, "k").Usage(context.Background())
		var e *client.Error
		if !errors.As(err, &e) || e.StatusCode != 429 || e.RetryAfter != time.Hour || e.Code != client.CodeRateLimitExceeded || s.calls.Load() != 1 {
			t.Fatalf("err = %+v after %d calls", err, s.calls.Load())
		}
	})
	t.Run("retries are counted", func(t *testing.T) {
		t.Parallel()
		s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) { tooMany(w, "") })
		c := newClient(t, s.URL, "k", client.WithRetry(client.RetryPolicy{MaxRetries: 2, Backoff: time.Millisecond}))
		_, err := c.Usage(context.Background())
		var e *client.Error
		if !errors.As(err, &e) || e.StatusCode != 429 || e.RetryAfter != 0 || s.calls.Load() != 3 {
			t.Fatalf("err = %v after %d calls; want the 429 after 3", err, s.calls.Load())
		}
	})
	t.Run("context ends the wait", func(t *testing.T) {
		t.Parallel()
		s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) { tooMany(w, "20") })
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := newClient(t, s.URL, "k").Usage(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
	})
	t.Run("other statuses are not retried", func(t *testing.T) {
		t.Parallel()
		s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "<html><body>502 Bad Gateway</body></html>")
		})
		_, err := newClient(t, s.URL, "k").Usage(context.Background())
		var e *client.Error
		if !errors.As(err, &e) || e.StatusCode != 502 || !strings.Contains(e.Message, "Bad Gateway") || s.calls.Load() != 1 {
			t.Fatalf("err = %+v after %d calls", err, s.calls.Load())
		}
	})
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	var got []string
	s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Authorization")+" "+r.Header.Get("User-Agent")+" "+r.Header.Get("Idempotency-Key"))
		if strings.HasPrefix(r.URL.Path, "/admin/") {
			fmt.Fprint(w, `{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}`)
			return
		}
		fmt.Fprint(w, `{"id":"job_1","object":"job","status":"queued"}`)
	})
	c := newClient(t, s.URL+"/base", "tenant-key", client.WithAdminToken("admin-token"), client.WithUserAgent("pipeline/2"))
	ctx := context.Background()
	if _, err := c.Jobs.Create(ctx, &client.JobCreateParams{Body: map[string]any{}, IdempotencyKey: "k1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin.ListTenants(ctx, &client.ListParams{Limit: 5, After: "ten_x"}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"POST /base/v1/jobs Bearer tenant-key pipeline/2 k1",
		"GET /base/admin/v1/tenants?after=ten_x&limit=5 Bearer admin-token pipeline/2 ",
	}
	s.locked(func() {
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// gatedReader gives first bytes, then blocks until open is closed, then
// gives rest bytes. An upload that buffered its content before sending
// would never see open closed.
type gatedReader struct {
	first, rest int64
	open        <-chan struct{}
	sum         *[32]byte
	h           interface {
		io.Writer
		Sum([]byte) []byte
	}
	n int64
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.n == g.first {
		select {
		case <-g.open:
		case <-time.After(20 * time.Second):
			return 0, errors.New("the server saw nothing of the first bytes: the upload is buffered, not streamed")
		}
	}
	limit := g.first
	if g.n >= g.first {
		limit = g.first + g.rest
	}
	if g.n == limit {
		copy(g.sum[:], g.h.Sum(nil))
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), limit-g.n)]
	for i := range p {
		p[i] = byte('a' + (g.n+int64(i))%26)
	}
	g.n += int64(len(p))
	g.h.Write(p)
	return len(p), nil
}

// TestUploadStreams: the server reads the first MiB of the file while the
// client has not read the rest from its source yet, so the content is never
// held whole in memory; the request is chunked and arrives intact.
func TestUploadStreams(t *testing.T) {
	t.Parallel()
	const first, rest = 1 << 20, 15 << 20
	open := make(chan struct{})
	var (
		received  int64
		serverSum [32]byte
		purpose   string
		filename  string
		length    int64
	)
	s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) {
		length = r.ContentLength
		mr, err := r.MultipartReader()
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		h := sha256.New()
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			switch part.FormName() {
			case "purpose":
				b, _ := io.ReadAll(part)
				purpose = string(b)
			case "file":
				filename = part.FileName()
				buf := make([]byte, 32<<10)
				for {
					k, err := part.Read(buf)
					h.Write(buf[:k])
					if received < first && received+int64(k) >= first {
						close(open)
					}
					received += int64(k)
					if err == io.EOF {
						break
					}
					if err != nil {
						http.Error(w, err.Error(), 400)
						return
					}
				}
			}
		}
		copy(serverSum[:], h.Sum(nil))
		fmt.Fprintf(w, `{"id":"file-1","object":"file","bytes":%d,"filename":%q,"purpose":%q,"status":"processed"}`, received, filename, purpose)
	})
	var clientSum [32]byte
	src := &gatedReader{first: first, rest: rest, open: open, sum: &clientSum, h: sha256.New()}
	f, err := newClient(t, s.URL, "k").Files.Upload(context.Background(), "/tmp/dir/requests.jsonl", src, "")
	if err != nil {
		t.Fatal(err)
	}
	s.locked(func() {
		if length != -1 {
			t.Errorf("Content-Length %d: the body was measured, so buffered", length)
		}
		if f.Bytes != first+rest || received != first+rest || serverSum != clientSum {
			t.Fatalf("server got %d bytes (file says %d), want %d intact", received, f.Bytes, first+rest)
		}
		if purpose != "batch" || filename != "requests.jsonl" {
			t.Fatalf("purpose %q, filename %q", purpose, filename)
		}
	})
}

// TestUploadRetry: a 429'd upload is sent again from the start when its
// content can seek back, and returned at once when it cannot.
func TestUploadRetry(t *testing.T) {
	t.Parallel()
	content := strings.Repeat(`{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{}}`+"\n", 1000)
	var bodies []string
	s := stub(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		f, _, err := r.FormFile("file")
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		b, _ := io.ReadAll(f)
		bodies = append(bodies, string(b))
		if n%2 == 1 {
			tooMany(w, "0.01")
			return
		}
		fmt.Fprintf(w, `{"id":"file-1","object":"file","bytes":%d}`, len(b))
	})
	c := newClient(t, s.URL, "k")
	f, err := c.Files.Upload(context.Background(), "in.jsonl", bytes.NewReader([]byte(content)), "batch")
	s.locked(func() {
		if err != nil || f.Bytes != int64(len(content)) || len(bodies) != 2 || bodies[0] != content || bodies[1] != content {
			t.Fatalf("seekable upload: %+v, %v after %d calls", f, err, len(bodies))
		}
	})

	_, err = c.Files.Upload(context.Background(), "in.jsonl", io.MultiReader(strings.NewReader(content)), "batch")
	var e *client.Error
	if !errors.As(err, &e) || e.StatusCode != 429 || s.calls.Load() != 3 {
		t.Fatalf("pipe upload: %v after %d calls; want the 429 at once", err, s.calls.Load())
	}
}
