package api_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/testutil"
)

// limitsPolicy is apptest's policy with tiers whose API limits the tests
// below exercise; auth_failure_limits is filled in per test.
const limitsPolicy = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 10s}
models:
  - name: gpt-4o-mini
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
tiers:
  - name: windows
    daily_budget_usd: 50
    api_limits: {second: 5, minute: 8}
  - name: both
    daily_budget_usd: 50
    api_limits: {second: 4, hour: 4}
  - name: soft
    daily_budget_usd: 50
    api_limits: {minute: 10}
  - name: softer
    daily_budget_usd: 50
    api_limits: {minute: 10}
    api_soft_limit: 0.5
  - name: uploads
    daily_budget_usd: 50
    api_rps: 100
    api_endpoint_limits:
      jobs.create: {minute: 2}
  - name: leased
    daily_budget_usd: 50
    api_limits: {second: 20, day: 1000}
    api_lease: 5
  - name: free
    daily_budget_usd: 1
    api_rps: 5
%s`

// startLimits starts an app on limitsPolicy with a clock frozen in the
// middle of a minute, so the tests move through windows by hand.
func startLimits(t *testing.T, extra string, o apptest.Options) (*apptest.App, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock(time.Date(2026, 12, 1, 12, 30, 30, 0, time.UTC))
	o.RedisDB, o.Clock = redisDB, clock.Now
	o.Policy = strings.Replace(limitsPolicy, "%s", extra, 1)
	return apptest.Start(t, o), clock
}

// rl is the rate-limit headers of a response.
type rl struct {
	status                          int
	limit, remaining, reset, window string
	warning, retry                  string
}

func rateHeaders(r *apptest.Response) rl {
	h := r.Header
	return rl{r.Status, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"),
		h.Get("X-RateLimit-Window"), h.Get("X-RateLimit-Warning"), h.Get("Retry-After")}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

// A tier's windows are checked together: a request the second window
// refuses takes nothing from the minute window; each 429 carries the
// numbers of the window that refused, and when several refuse, of the one
// that frees last.
func TestAPIWindowsAllOrNothing(t *testing.T) {
	t.Parallel()
	a, clock := startLimits(t, "", apptest.Options{})
	_, key := a.Tenant("windows") // 5 a second, 8 a minute
	for i := range 5 {
		if h := rateHeaders(a.Do("GET", "/v1/jobs", key, nil)); h.status != 200 || h.remaining != strconv.Itoa(4-i) || h.limit != "5" || h.window != "second" {
			t.Fatalf("request %d: %+v, want 200 with %d left of the second's 5", i, h, 4-i)
		}
	}
	for range 3 {
		r := a.Do("GET", "/v1/jobs", key, nil)
		checkError(t, r, 429, client.CodeRateLimitExceeded, "")
		h := rateHeaders(r)
		// The 5 weigh fully for the rest of this second, then fade: one more
		// fits 1.2 s from now.
		if h.window != "second" || h.limit != "5" || h.remaining != "0" || h.retry != "2" || h.reset != "2" {
			t.Fatalf("429 of the second window: %+v", h)
		}
		if !strings.Contains(string(r.Body), "5 requests per second for this API key reached. Retry after 1.2s.") {
			t.Fatalf("429 does not name the second window: %s", r.Body)
		}
	}
	// Two seconds on, the minute has 3 left: the refused requests took none.
	clock.Add(2 * time.Second)
	for i := range 3 {
		if h := rateHeaders(a.Do("GET", "/v1/jobs", key, nil)); h.status != 200 || h.window != "minute" || h.remaining != strconv.Itoa(2-i) {
			t.Fatalf("request %d two seconds on: %+v, want 200 with %d left of the minute's 8", i, h, 2-i)
		}
	}
	r := a.Do("GET", "/v1/jobs", key, nil)
	checkError(t, r, 429, client.CodeRateLimitExceeded, "")
	if h := rateHeaders(r); h.window != "minute" || h.limit != "8" || h.remaining != "0" || atoi(t, h.retry) < 25 || atoi(t, h.retry) > 60 {
		t.Fatalf("429 of the minute window: %+v", h)
	}

	// Both windows full: the hour frees last, and every number is its own.
	_, key = a.Tenant("both") // 4 a second, 4 an hour
	for range 4 {
		a.Do("GET", "/v1/jobs", key, nil)
	}
	r = a.Do("GET", "/v1/jobs", key, nil)
	checkError(t, r, 429, client.CodeRateLimitExceeded, "")
	h := rateHeaders(r)
	// At 12:30:32 the hour's 4 weigh fully until 13:00, then fade: one more
	// fits at 13:15, and all are gone at 14:00.
	if h.window != "hour" || h.limit != "4" || h.remaining != "0" || h.retry != "2668" || h.reset != "5368" {
		t.Fatalf("429 refused by both windows: %+v, want the hour's numbers", h)
	}
	if !strings.Contains(string(r.Body), "4 requests per hour") {
		t.Fatalf("429 does not name the hour window: %s", r.Body)
	}
}

// Past api_soft_limit (0.8 by default) of a window, responses carry
// X-RateLimit-Warning naming it, the 429 included.
func TestAPISoftLimitWarning(t *testing.T) {
	t.Parallel()
	a, _ := startLimits(t, "", apptest.Options{})
	for _, c := range []struct {
		tier  string
		first int // the request (1-based) from which the warning shows
		soft  string
	}{{"soft", 8, "80%"}, {"softer", 5, "50%"}} {
		_, key := a.Tenant(c.tier)
		for i := 1; i <= 11; i++ {
			r := a.Do("GET", "/v1/jobs", key, nil)
			h := rateHeaders(r)
			if (h.status == 200) != (i <= 10) {
				t.Fatalf("%s request %d: %d", c.tier, i, h.status)
			}
			used := min(i, 10)
			want := ""
			if i >= c.first {
				want = "minute: " + strconv.Itoa(used) + " of 10 used (" + strconv.Itoa(used*10) + "%, soft limit " + c.soft + ")"
			}
			if h.warning != want {
				t.Fatalf("%s request %d: X-RateLimit-Warning %q, want %q", c.tier, i, h.warning, want)
			}
		}
	}
}

// An endpoint's own lower limit is counted per key and endpoint: its 429
// names the endpoint's window, and its refusals take nothing from the key's
// own windows, which the other endpoints keep using.
func TestAPIEndpointLimits(t *testing.T) {
	t.Parallel()
	a, _ := startLimits(t, "", apptest.Options{})
	_, key := a.Tenant("uploads") // 100 a second; jobs.create 2 a minute
	job := map[string]any{"body": apptest.ChatBody("hi", "", 5)}
	for i := range 2 {
		r := a.Do("POST", "/v1/jobs", key, job)
		if h := rateHeaders(r); r.Status != 202 || h.window != "jobs.create:minute" || h.remaining != strconv.Itoa(1-i) {
			t.Fatalf("job %d: %d %+v", i, r.Status, h)
		}
	}
	for range 3 {
		r := a.Do("POST", "/v1/jobs", key, job)
		checkError(t, r, 429, client.CodeRateLimitExceeded, "")
		if h := rateHeaders(r); h.window != "jobs.create:minute" || h.limit != "2" || !strings.Contains(string(r.Body), "2 requests per minute to jobs.create") {
			t.Fatalf("the endpoint's 429: %+v %s", h, r.Body)
		}
	}
	// 2 jobs created, 3 refused, then this one: 97 of the key's 100 left.
	if h := rateHeaders(a.Do("GET", "/v1/jobs", key, nil)); h.status != 200 || h.window != "second" || h.remaining != "97" {
		t.Fatalf("the key's own window after the endpoint's refusals: %+v, want 97 left", h)
	}
	if n := a.TaskCount(); n != 2 {
		t.Fatalf("%d tasks queued, want the 2 admitted jobs", n)
	}
}

// endpointRequests is one request to each tenant endpoint, by name.
var endpointRequests = map[string][2]string{
	"jobs.create": {"POST", "/v1/jobs"}, "jobs.list": {"GET", "/v1/jobs"},
	"jobs.retrieve": {"GET", "/v1/jobs/job_x"}, "jobs.cancel": {"DELETE", "/v1/jobs/job_x"},
	"files.create": {"POST", "/v1/files"}, "files.list": {"GET", "/v1/files"},
	"files.retrieve": {"GET", "/v1/files/file-x"}, "files.content": {"GET", "/v1/files/file-x/content"},
	"files.delete": {"DELETE", "/v1/files/file-x"}, "batches.create": {"POST", "/v1/batches"},
	"batches.list": {"GET", "/v1/batches"}, "batches.retrieve": {"GET", "/v1/batches/batch_x"},
	"batches.cancel": {"POST", "/v1/batches/batch_x/cancel"}, "usage.retrieve": {"GET", "/v1/usage"},
}

// Every endpoint a tier may limit is the route it names: with a limit of
// one a minute on each, each route's first answer is counted in its own
// window.
func TestEveryEndpointHasItsLimit(t *testing.T) {
	t.Parallel()
	names := make([]string, 0, len(endpointRequests))
	var limits strings.Builder
	for name := range endpointRequests {
		names = append(names, name)
		limits.WriteString("      " + name + ": {minute: 1}\n")
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(config.APIEndpoints))
	if !slices.Equal(names, want) {
		t.Fatalf("the test covers %v, the policy knows %v", names, want)
	}
	a, _ := startLimits(t, `  - name: each
    daily_budget_usd: 50
    api_rps: 100
    api_endpoint_limits:
`+limits.String(), apptest.Options{})
	_, key := a.Tenant("each")
	for _, name := range names {
		req := endpointRequests[name]
		r := a.Do(req[0], req[1], key, nil)
		if h := rateHeaders(r); h.window != name+":minute" || h.remaining != "0" || r.Status == 429 {
			t.Errorf("%s %s (%s): %d %+v, want its own window with nothing left", req[0], req[1], name, r.Status, h)
		}
		if r := a.Do(req[0], req[1], key, nil); r.Status != 429 {
			t.Errorf("%s %s again: %d, want 429", req[0], req[1], r.Status)
		}
	}
}

// A tier's api_lease takes slices of the key's windows from Redis and
// spends them in process: Redis counts whole slices, the responses count
// each request, and the limit holds exactly.
func TestAPILease(t *testing.T) {
	t.Parallel()
	a, _ := startLimits(t, "", apptest.Options{})
	tenantKey := func() (string, string) {
		tenant, key := a.Tenant("leased") // 20 a second, 1000 a day; slices of 5
		keys, err := a.Store.APIKeyListByTenant(context.Background(), tenant)
		if err != nil || len(keys) != 1 {
			t.Fatal(keys, err)
		}
		return keys[0].ID, key
	}
	id, key := tenantKey()
	redisLeft := func() int64 {
		t.Helper()
		set := limiter.WindowSet{Algorithm: limiter.AlgSlidingWindow, Scope: "api:" + id,
			Windows: []limiter.NamedWindow{{Name: "second", Window: limiter.Window{Limit: 20, Period: time.Second}},
				{Name: "day", Window: limiter.Window{Limit: 1000, Period: 24 * time.Hour}}}}
		r, err := a.APILimiter.Allow(context.Background(), set, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.Buckets[0].Remaining
	}
	for i := range 3 {
		if h := rateHeaders(a.Do("GET", "/v1/jobs", key, nil)); h.status != 200 || h.remaining != strconv.Itoa(19-i) {
			t.Fatalf("request %d: %+v, want %d left", i, h, 19-i)
		}
	}
	if got := redisLeft(); got != 15 {
		t.Fatalf("Redis has %d left after 3 requests, want 15: one slice of 5 counted", got)
	}
	admitted := 3
	for a.Do("GET", "/v1/jobs", key, nil).Status == 200 {
		admitted++
	}
	if admitted != 20 {
		t.Fatalf("the lease admitted %d in one second, want exactly 20", admitted)
	}
}

// A policy reload applies new limits from the next request, with no restart.
func TestAPILimitsReload(t *testing.T) {
	t.Parallel()
	a, _ := startLimits(t, "", apptest.Options{})
	_, key := a.Tenant("free") // 5 a second
	for range 5 {
		a.Do("GET", "/v1/jobs", key, nil)
	}
	if r := a.Do("GET", "/v1/jobs", key, nil); r.Status != 429 {
		t.Fatalf("the sixth: %d, want 429", r.Status)
	}
	path := a.Policy.Path()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data = []byte(strings.Replace(string(data), "    daily_budget_usd: 1\n    api_rps: 5\n", "    daily_budget_usd: 1\n    api_limits: {second: 8}\n", 1))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Policy.Reload(); err != nil {
		t.Fatal(err)
	}
	if tr, _ := a.Policy.Current().Tier("free"); tr.APILimits.Second != 8 {
		t.Fatalf("reloaded free tier: %+v", tr.APILimits)
	}
	for i := range 3 {
		if h := rateHeaders(a.Do("GET", "/v1/jobs", key, nil)); h.status != 200 || h.limit != "8" || h.remaining != strconv.Itoa(2-i) {
			t.Fatalf("request %d after the reload: %+v, want 8 a second", i, h)
		}
	}
	if r := a.Do("GET", "/v1/jobs", key, nil); r.Status != 429 || r.Header.Get("X-RateLimit-Limit") != "8" {
		t.Fatalf("the ninth: %d %v", r.Status, r.Header)
	}
}

// A key (not only a tier or a tenant) is exempt through the admin API, at
// creation or later; the key listing shows it; an exempt key carries no
// limit headers, and one put back under its tier's limit is limited again.
func TestKeyExemption(t *testing.T) {
	t.Parallel()
	a, _ := startLimits(t, "", apptest.Options{})
	tenant, limited := a.Tenant("free") // 5 a second
	r := a.Do("POST", "/admin/v1/tenants/"+tenant+"/keys", apptest.AdminToken, map[string]any{"api_exempt": true})
	if r.Status != 201 || r.Map(t)["api_exempt"] != true {
		t.Fatalf("create an exempt key: %d %s", r.Status, r.Body)
	}
	exempt, exemptID := r.Map(t)["key"].(string), r.Map(t)["id"].(string)
	got429 := false
	for i := range 20 {
		if r := a.Do("GET", "/v1/jobs", exempt, nil); r.Status != 200 || r.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("exempt key, request %d: %d %v", i, r.Status, r.Header)
		}
		got429 = got429 || a.Do("GET", "/v1/jobs", limited, nil).Status == 429
	}
	if !got429 {
		t.Fatal("the tenant's other key was never limited")
	}
	l := a.Do("GET", "/admin/v1/tenants/"+tenant+"/keys", apptest.AdminToken, nil)
	var list struct {
		Data []struct {
			ID        string `json:"id"`
			APIExempt bool   `json:"api_exempt"`
		} `json:"data"`
	}
	l.JSON(t, &list)
	if len(list.Data) != 2 {
		t.Fatalf("listing: %s", l.Body)
	}
	for _, k := range list.Data {
		if k.APIExempt != (k.ID == exemptID) {
			t.Fatalf("listing shows %s exempt %v: %s", k.ID, k.APIExempt, l.Body)
		}
	}

	// Back under the tier's limit, from its next request.
	r = a.Do("PATCH", "/admin/v1/keys/"+exemptID, apptest.AdminToken, map[string]any{"api_exempt": false})
	if r.Status != 200 || r.Map(t)["api_exempt"] != false {
		t.Fatalf("PATCH: %d %s", r.Status, r.Body)
	}
	statuses := map[int]int{}
	for range 8 {
		statuses[a.Do("GET", "/v1/jobs", exempt, nil).Status]++
	}
	if statuses[200] != 5 || statuses[429] != 3 {
		t.Fatalf("the key back under 5 a second answered %v", statuses)
	}
	checkError(t, a.Do("PATCH", "/admin/v1/keys/"+exemptID, apptest.AdminToken, map[string]any{"api_exempt": "yes"}), 400, client.CodeInvalidType, "api_exempt")
	checkError(t, a.Do("PATCH", "/admin/v1/keys/"+exemptID, apptest.AdminToken, map[string]any{"exempt": true}), 400, client.CodeUnknownField, "exempt")
	checkError(t, a.Do("PATCH", "/admin/v1/keys/key_01nosuchkey0000000000000", apptest.AdminToken, map[string]any{"api_exempt": true}), 404, client.CodeNotFound, "")
	checkError(t, a.Do("PATCH", "/admin/v1/keys/"+exemptID, "", map[string]any{"api_exempt": true}), 401, client.CodeInvalidAdminToken, "")
}

// Requests with a missing or wrong key are limited per client address:
// past auth_failure_limits they are refused with 429 until the window
// frees, while a good key or the admin token from that very address still
// passes (an attacker behind a shared NAT or proxy locks out only its own
// guesses), and other addresses are not affected. The address is the
// connection's; X-Forwarded-For counts only from a trusted proxy, read from
// the right.
func TestAuthFailuresPerAddress(t *testing.T) {
	t.Parallel()
	const limits = "auth_failure_limits: {minute: 3}\n"
	// Through a trusted proxy (the test's loopback connection).
	a, clock := startLimits(t, limits, apptest.Options{Environ: []string{"LLMQ_TRUSTED_PROXIES=127.0.0.1, 10.0.0.0/8"}})
	_, good := a.Tenant("free")
	from := func(xff ...string) http.Header {
		h := http.Header{}
		for _, v := range xff {
			h.Add("X-Forwarded-For", v)
		}
		return h
	}
	do := func(token string, h http.Header) *apptest.Response {
		return apptest.Do(t, a.URL, "GET", "/v1/jobs", token, nil, h)
	}
	attacker := from("203.0.113.7")
	for _, token := range []string{"", "llmq_wrong", "llmq_wrong2"} {
		checkError(t, do(token, attacker), 401, client.CodeInvalidAPIKey, "")
	}
	r := do("llmq_wrong", attacker)
	checkError(t, r, 429, client.CodeTooManyAuthFailures, "")
	if h := rateHeaders(r); h.window != "auth_failures:minute" || h.limit != "3" || h.remaining != "0" || atoi(t, h.retry) < 1 || atoi(t, h.retry) > 120 {
		t.Fatalf("429 headers: %+v", h)
	}
	// The same client behind another proxy hop, or claiming another origin
	// further left, is the same address: its guesses stay refused, its
	// good key passes.
	for _, h := range []http.Header{from("198.51.100.9, 203.0.113.7"), from("198.51.100.9", "203.0.113.7, 10.1.2.3"), attacker} {
		checkError(t, do("llmq_wrong3", h), 429, client.CodeTooManyAuthFailures, "")
		if r := do(good, h); r.Status != 200 {
			t.Fatalf("a good key from a blocked address: %d %s", r.Status, r.Body)
		}
	}
	// The admin token is guessed the same way, and passes the same way.
	checkError(t, apptest.Do(t, a.URL, "GET", "/admin/v1/tenants", "not-the-token", nil, attacker), 429, client.CodeTooManyAuthFailures, "")
	if r := apptest.Do(t, a.URL, "GET", "/admin/v1/tenants", apptest.AdminToken, nil, attacker); r.Status != 200 {
		t.Fatalf("the admin token from a blocked address: %d %s", r.Status, r.Body)
	}
	// Other addresses are not affected.
	if r := do(good, from("203.0.113.8")); r.Status != 200 {
		t.Fatalf("another address with a good key: %d %s", r.Status, r.Body)
	}
	checkError(t, do("llmq_wrong", from("203.0.113.8")), 401, client.CodeInvalidAPIKey, "")
	if r := do(good, nil); r.Status != 200 {
		t.Fatalf("the proxy's own address with a good key: %d", r.Status)
	}
	// Once the window frees, the address is served again.
	clock.Add(2 * time.Minute)
	if r := do(good, attacker); r.Status != 200 {
		t.Fatalf("after the window: %d %s", r.Status, r.Body)
	}
	checkError(t, do("llmq_wrong", attacker), 401, client.CodeInvalidAPIKey, "")

	// Without trusted proxies X-Forwarded-For is the client's word: every
	// request is the connection's address, however it is spoofed.
	b, _ := startLimits(t, limits, apptest.Options{})
	_, good = b.Tenant("free")
	for i := range 4 {
		want, code := 401, client.CodeInvalidAPIKey
		if i == 3 {
			want, code = 429, client.CodeTooManyAuthFailures
		}
		checkError(t, apptest.Do(t, b.URL, "GET", "/v1/jobs", "llmq_wrong", nil, from("203.0.113."+strconv.Itoa(i))), want, code, "")
	}
	checkError(t, apptest.Do(t, b.URL, "GET", "/v1/jobs", "llmq_wrong", nil, from("192.0.2.1")), 429, client.CodeTooManyAuthFailures, "")
	if r := apptest.Do(t, b.URL, "GET", "/v1/jobs", good, nil, from("192.0.2.1")); r.Status != 200 {
		t.Fatalf("a good key from the blocked connection: %d %s", r.Status, r.Body)
	}
}

// Concurrent requests of one key are counted together when they come while
// another's count is under way; a group the windows cannot hold whole is
// counted again request by request. However they are grouped, exactly the
// windows' room is allowed, and the refused take nothing.
func TestConcurrentRequestsOfAKeyAreCountedExactly(t *testing.T) {
	t.Parallel()
	a, clock := startLimits(t, "", apptest.Options{})
	_, key := a.Tenant("windows") // 5 a second, 8 a minute
	const n = 40
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { statuses <- a.Do("GET", "/v1/jobs", key, nil).Status })
	}
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	if count[200] != 5 || count[429] != n-5 {
		t.Fatalf("%d concurrent requests against 5 a second: %v, want 5 allowed and the rest refused", n, count)
	}
	// Two seconds on, the minute has 3 left: the refused requests took none.
	clock.Add(2 * time.Second)
	for i := range 4 {
		r := a.Do("GET", "/v1/jobs", key, nil)
		if want := 200; i == 3 {
			checkError(t, r, 429, client.CodeRateLimitExceeded, "")
		} else if h := rateHeaders(r); h.status != want || h.window != "minute" || h.remaining != strconv.Itoa(2-i) {
			t.Fatalf("request %d two seconds on: %+v, want 200 with %d left of the minute's 8", i, h, 2-i)
		}
	}
}
