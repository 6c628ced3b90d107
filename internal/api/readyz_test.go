package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
)

// /readyz, given a check per service, names the one that does not answer
// and why, in words without its address, and is 200 again once it is back.
func TestReadyzNamesTheServiceThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	srv := testutil.StartRedis(t)
	a := apptest.Start(t, apptest.Options{RedisURL: "redis://" + srv.Addr + "/" + strconv.Itoa(redisDB), NoScheduler: true})
	s, err := api.New(api.Deps{Store: a.Store, Policy: a.Policy, ReadyChecks: []api.ReadyCheck{
		{Name: "redis", Check: func(ctx context.Context) error { return a.Redis.Ping(ctx).Err() }},
		{Name: "database", Check: a.Store.Ping},
	}}, api.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	readyz := func() *apptest.Response { return apptest.Do(t, hs.URL, "GET", "/readyz", "", nil, nil) }

	if r := readyz(); r.Status != http.StatusOK || r.Map(t)["status"] != "ready" || r.Map(t)["redis"] != "ok" || r.Map(t)["database"] != "ok" {
		t.Fatalf("readyz with both up: %d %s", r.Status, r.Body)
	}

	srv.Stop()
	r := readyz()
	checkError(t, r, http.StatusServiceUnavailable, client.CodeNotReady, "")
	m := r.Map(t)
	if m["status"] != "unavailable" || m["redis"] != "connection refused" || m["database"] != "ok" {
		t.Fatalf("readyz with Redis down: %s, want status unavailable, redis connection refused, database ok", r.Body)
	}
	if e := checkError(t, r, http.StatusServiceUnavailable, client.CodeNotReady, ""); !strings.Contains(e.Error.Message, "redis: connection refused") {
		t.Errorf("message %q does not name redis", e.Error.Message)
	}
	_, port, _ := strings.Cut(srv.Addr, ":")
	if strings.Contains(string(r.Body), port) {
		t.Fatalf("readyz shows Redis's address: %s", r.Body)
	}

	srv.Start()
	testutil.Eventually(t, 10*time.Second, func() bool { return readyz().Status == http.StatusOK })
}
