package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/store"
)

// Admin writes with a body must say it is JSON: a page in the operator's
// browser can send text/plain or a form cross-site without a preflight,
// never application/json. Bodiless writes (create a key, revoke) need no type.
func TestAdminWritesMustBeJSON(t *testing.T) {
	t.Parallel()
	a := start(t)
	before := countTenants(t, a)
	body := `{"name":"csrf","tier":"standard"}`
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""} {
		r := apptest.Do(t, a.URL, "POST", "/admin/v1/tenants", apptest.AdminToken, body, http.Header{"Content-Type": {ct}})
		checkError(t, r, http.StatusUnsupportedMediaType, "unsupported_media_type", "Content-Type")
	}
	if n := countTenants(t, a); n != before {
		t.Fatalf("refused requests created %d tenants", n-before)
	}
	r := apptest.Do(t, a.URL, "POST", "/admin/v1/tenants", apptest.AdminToken, body, http.Header{"Content-Type": {"application/json; charset=utf-8"}})
	if r.Status != http.StatusCreated {
		t.Fatalf("JSON with a charset: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	if r := apptest.Do(t, a.URL, "POST", "/admin/v1/tenants/"+id+"/keys", apptest.AdminToken, nil, nil); r.Status != http.StatusCreated {
		t.Fatalf("bodiless key creation: %d %s", r.Status, r.Body)
	}
	// Reads need no type, and tenant routes take what curl -d sends.
	if r := apptest.Do(t, a.URL, "GET", "/admin/v1/tenants", apptest.AdminToken, nil, nil); r.Status != http.StatusOK {
		t.Fatalf("GET: %d", r.Status)
	}
}

func countTenants(t *testing.T, a *apptest.App) int {
	t.Helper()
	ts, _, err := a.Store.TenantList(context.Background(), &store.TenantListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(ts)
}

// What a browser sends from another site's page, with the basic-auth
// password it remembers, is refused with a 403 (the write of the issue: a
// text/plain POST that created a tenant); the same request from llmq's own
// pages, or from a program, passes.
func TestCrossSiteAdminRequestsAreRefused(t *testing.T) {
	t.Parallel()
	a := start(t)
	c, _ := client.New(a.URL, "")
	host := strings.TrimPrefix(c.BaseURL(), "http://")
	basic := func(h http.Header) http.Header {
		h.Set("Authorization", "Basic "+basicAuth("admin", apptest.AdminToken))
		h.Set("Content-Type", "application/json")
		return h
	}
	body := `{"name":"csrf","tier":"standard"}`
	before := countTenants(t, a)
	for name, h := range map[string]http.Header{
		"Sec-Fetch-Site cross-site":      {"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"no-cors"}},
		"Sec-Fetch-Site same-site":       {"Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"cors"}},
		"a form navigation cross-site":   {"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}},
		"Origin of another site":         {"Origin": {"https://evil.example"}},
		"Origin of another port":         {"Origin": {"http://127.0.0.1:1"}},
		"Origin null (a sandboxed page)": {"Origin": {"null"}},
	} {
		r := apptest.Do(t, a.URL, "POST", "/admin/v1/tenants", "", body, basic(h))
		if r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), string(client.CodeCrossSiteRequest)) {
			t.Errorf("%s: %d %s; want 403 cross_site_request", name, r.Status, r.Body)
		}
	}
	// A read from another site's script is refused too; following a link
	// to the admin API is not.
	if r := apptest.Do(t, a.URL, "GET", "/admin/v1/tenants", "", nil, basic(http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"cors"}})); r.Status != http.StatusForbidden {
		t.Errorf("cross-site fetch: %d", r.Status)
	}
	if r := apptest.Do(t, a.URL, "GET", "/admin/v1/tenants", "", nil, basic(http.Header{"Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"navigate"}, "Sec-Fetch-Dest": {"document"}})); r.Status != http.StatusOK {
		t.Errorf("a link followed from another site: %d", r.Status)
	}
	if n := countTenants(t, a); n != before {
		t.Fatalf("refused requests created %d tenants", n-before)
	}
	for name, h := range map[string]http.Header{
		"same origin":         {"Sec-Fetch-Site": {"same-origin"}, "Origin": {"http://" + host}},
		"typed in the bar":    {"Sec-Fetch-Site": {"none"}},
		"an older browser":    {"Origin": {"http://" + host}},
		"a program (no hint)": {},
	} {
		if r := apptest.Do(t, a.URL, "POST", "/admin/v1/tenants", "", body, basic(h)); r.Status != http.StatusCreated {
			t.Errorf("%s: %d %s; want 201", name, r.Status, r.Body)
		}
	}
}

func basicAuth(user, pass string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}
