package api

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// BenchmarkHTTPServer is one POST of a small JSON body over a kept-alive
// loopback connection, answered after reading the body: through a bare
// http.Server (what the dispatcher ran before) and through NewHTTPServer,
// whose deadlines cost a few ResponseController calls per request.
func BenchmarkHTTPServer(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"job_1","status":"queued"}`)
	})
	body := bytes.Repeat([]byte("x"), 300)
	for _, c := range []struct {
		name string
		srv  func() *http.Server
	}{
		{"bare", func() *http.Server { return &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second} }},
		{"limits", func() *http.Server { return NewHTTPServer(handler, ServerOptions{}) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := c.srv()
			go func() { _ = srv.Serve(ln) }()
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			url := "http://" + ln.Addr().String() + "/v1/jobs"
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
