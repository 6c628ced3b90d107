package api_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/testutil"
)

// secondDispatcher opens another app over a's database, Redis namespace and
// policy, with its own API (and key cache), as a second dispatcher process
// would be.
func secondDispatcher(t *testing.T, a *apptest.App, clock func() time.Time) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := apptest.OpenEnviron(ctx, a.Environ, config.RoleDispatcher, slog.New(slog.DiscardHandler), app.Parts{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	srv := httptest.NewServer(testutil.Must(b.API()))
	t.Cleanup(srv.Close)
	return srv.URL
}

// newKey adds a key to tenant and returns its id and secret.
func newKey(t *testing.T, a *apptest.App, tenant string) (id, key string) {
	t.Helper()
	r := a.Do("POST", "/admin/v1/tenants/"+tenant+"/keys", apptest.AdminToken, nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create key: %d %s", r.Status, r.Body)
	}
	m := r.Map(t)
	return m["id"].(string), m["key"].(string)
}

// TestKeyCacheRevocationReachesEveryDispatcher: a key two dispatchers have
// cached, revoked through one's admin API, is refused by that one at once
// and by the other as soon as the announcement arrives; the clock stands
// still, so no expiry explains it.
func TestKeyCacheRevocationReachesEveryDispatcher(t *testing.T) {
	t.Parallel()
	now := time.Now()
	clock := func() time.Time { return now }
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Clock: clock})
	bURL := secondDispatcher(t, a, clock)
	tenant, _ := a.Tenant("standard")
	id, key := newKey(t, a, tenant)

	for _, base := range []string{a.URL, bURL} {
		for range 2 { // the second answer comes from the cache
			if r := apptest.Do(t, base, "GET", "/v1/jobs", key, nil, nil); r.Status != http.StatusOK {
				t.Fatalf("GET %s/v1/jobs before revocation: %d %s", base, r.Status, r.Body)
			}
		}
	}
	if r := a.Do("DELETE", "/admin/v1/keys/"+id, apptest.AdminToken, nil); r.Status != http.StatusOK {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	if r := apptest.Do(t, a.URL, "GET", "/v1/jobs", key, nil, nil); r.Status != http.StatusUnauthorized {
		t.Fatalf("the revoking dispatcher answers %d after revocation: %s", r.Status, r.Body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := apptest.Do(t, bURL, "GET", "/v1/jobs", key, nil, nil)
		if r.Status == http.StatusUnauthorized {
			break
		}
		if r.Status != http.StatusOK || time.Now().After(deadline) {
			t.Fatalf("the other dispatcher still answers %d after the revocation was announced: %s", r.Status, r.Body)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeyCacheExpires: a key revoked behind the API's back (no
// announcement) is still accepted from the cache, and refused once the
// entry's TTL has passed.
func TestKeyCacheExpires(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Clock: clock})
	tenant, _ := a.Tenant("standard")
	id, key := newKey(t, a, tenant)

	if r := a.Do("GET", "/v1/jobs", key, nil); r.Status != http.StatusOK {
		t.Fatalf("GET /v1/jobs: %d %s", r.Status, r.Body)
	}
	if _, err := a.Store.APIKeyRevoke(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	if r := a.Do("GET", "/v1/jobs", key, nil); r.Status != http.StatusOK {
		t.Fatalf("GET /v1/jobs from the cache: %d %s", r.Status, r.Body)
	}
	now.Add(int64(5*time.Second + time.Millisecond))
	if r := a.Do("GET", "/v1/jobs", key, nil); r.Status != http.StatusUnauthorized {
		t.Fatalf("GET /v1/jobs after the cache's TTL: %d %s, want 401", r.Status, r.Body)
	}
}
