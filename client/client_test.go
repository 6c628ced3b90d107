package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/testutil"
)

// redisDB is the Redis database of client tests (docs/ARCHITECTURE.md).
const redisDB = 13

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// setup starts a test llmq (with workers when workers > 0) and returns it
// with a client of a new standard-tier tenant, the tenant's id, and an admin
// client.
func setup(t *testing.T, workers int) (a *apptest.App, c *client.Client, tenantID string, admin *client.Client) {
	t.Helper()
	a = apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: workers})
	tenantID, key := a.Tenant("standard")
	c = newClient(t, a.URL, key)
	admin = newClient(t, a.URL, "", client.WithAdminToken(apptest.AdminToken))
	return a, c, tenantID, admin
}

func newClient(t *testing.T, url, key string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(url, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func chat(content, user string) *client.JobCreateParams {
	return &client.JobCreateParams{CustomID: user, Body: apptest.ChatBody(content, user, 50)}
}

func TestNewRejectsBadURL(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := client.New(u, "k"); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	// An OpenAI SDK's base URL (with /v1) reaches the same server.
	c, err := client.New("http://127.0.0.1:8080/v1/", "k")
	if err != nil || c.BaseURL() != "http://127.0.0.1:8080" {
		t.Fatalf("New(.../v1/) = %v, %v", c.BaseURL(), err)
	}
}

func TestJobsCreateWaitGetCancel(t *testing.T) {
	t.Parallel()
	_, c, _, _ := setup(t, 1)
	ctx := ctxT(t)

	p := chat("Say hi", "u-1")
	p.IdempotencyKey = "order-17"
	p.Metadata = map[string]string{"team": "search"}
	j, err := c.Jobs.Create(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(j.ID, "job_") || j.CustomID == nil || *j.CustomID != "u-1" || j.Model != "gpt-4o-mini" {
		t.Fatalf("created job = %+v", j)
	}
	// The same key returns the same job, not a second one.
	again, err := c.Jobs.Create(ctx, p)
	if err != nil || again.ID != j.ID {
		t.Fatalf("idempotent create = %v, %v; want job %s", again, err, j.ID)
	}

	done, err := c.Jobs.Wait(ctx, j.ID, &client.WaitOptions{Interval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if done.Status != "succeeded" || done.Response == nil || done.Response.StatusCode != 200 || done.Usage == nil || done.Usage.TotalTokens == 0 {
		t.Fatalf("waited job = %+v", done)
	}
	var body struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(done.Response.Body, &body); err != nil || len(body.Choices) != 1 || !strings.HasPrefix(body.Choices[0].Message.Content, "u-1") {
		t.Fatalf("response body = %s (%v)", done.Response.Body, err)
	}
	if done.Metadata["team"] != "search" || done.CostUSD <= 0 {
		t.Fatalf("metadata %v, cost %v", done.Metadata, done.CostUSD)
	}

	got, err := c.Jobs.Get(ctx, j.ID)
	if err != nil || got.Status != "succeeded" || got.FinishedAt == nil {
		t.Fatalf("Get = %+v, %v", got, err)
	}

	// A finished job cannot be cancelled: a 409 as an *Error.
	_, err = c.Jobs.Cancel(ctx, j.ID)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict || apiErr.Code != client.CodeJobFinished {
		t.Fatalf("cancel of a finished job: %v", err)
	}
}

func TestJobsCancelQueued(t *testing.T) {
	t.Parallel()
	_, c, _, _ := setup(t, 0) // no workers: the job stays queued
	ctx := ctxT(t)
	j, err := c.Jobs.Create(ctx, chat("Say hi", ""))
	if err != nil {
		t.Fatal(err)
	}
	if j.Finished() {
		t.Fatalf("a new job is finished: %s", j.Status)
	}
	cancelled, err := c.Jobs.Cancel(ctx, j.ID)
	if err != nil || cancelled.Status != "cancelled" || !cancelled.Finished() {
		t.Fatalf("Cancel = %+v, %v", cancelled, err)
	}
	// Wait returns a finished job at once.
	w, err := c.Jobs.Wait(ctx, j.ID, nil)
	if err != nil || w.Status != "cancelled" {
		t.Fatalf("Wait = %+v, %v", w, err)
	}
}

func TestJobsWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	_, c, _, _ := setup(t, 0)
	j, err := c.Jobs.Create(ctxT(t), chat("Say hi", ""))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	last, err := c.Jobs.Wait(ctx, j.ID, &client.WaitOptions{Interval: 10 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || last == nil || last.Status != "queued" {
		t.Fatalf("Wait = %+v, %v; want the queued job and the deadline", last, err)
	}
}

func TestJobsListAndAll(t *testing.T) {
	t.Parallel()
	_, c, _, _ := setup(t, 0)
	ctx := ctxT(t)
	var ids []string
	for i := range 7 {
		j, err := c.Jobs.Create(ctx, chat(fmt.Sprintf("line %d", i), fmt.Sprintf("c%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	cancelled, err := c.Jobs.Cancel(ctx, ids[3])
	if err != nil {
		t.Fatal(err)
	}

	page, err := c.Jobs.List(ctx, &client.JobListParams{Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 3 || !page.HasMore || page.Data[0].ID != ids[6] || *page.LastID != ids[4] {
		t.Fatalf("first page = %+v", page)
	}

	// All walks every page, newest first, each job once.
	var seen []string
	for j, err := range c.Jobs.All(ctx, &client.JobListParams{Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, j.ID)
	}
	if len(seen) != len(ids) {
		t.Fatalf("All saw %d jobs, want %d: %v", len(seen), len(ids), seen)
	}
	for i, id := range seen {
		if id != ids[len(ids)-1-i] {
			t.Fatalf("All order: %v, want newest first of %v", seen, ids)
		}
	}

	// Breaking out of the loop stops the paging.
	n := 0
	for _, err := range c.Jobs.All(ctx, &client.JobListParams{Limit: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		if n++; n == 3 {
			break
		}
	}

	// Filters reach the server.
	var only []string
	for j, err := range c.Jobs.All(ctx, &client.JobListParams{Status: "cancelled"}) {
		if err != nil {
			t.Fatal(err)
		}
		only = append(only, j.ID)
	}
	if len(only) != 1 || only[0] != cancelled.ID {
		t.Fatalf("cancelled jobs = %v, want [%s]", only, cancelled.ID)
	}

	// A bad filter ends the iteration with the server's error.
	for j, err := range c.Jobs.All(ctx, &client.JobListParams{Status: "lost"}) {
		var apiErr *client.Error
		if j != nil || !errors.As(err, &apiErr) || apiErr.Param != "status" {
			t.Fatalf("bad filter: %v, %v", j, err)
		}
	}
}

func TestErrorsDecode(t *testing.T) {
	t.Parallel()
	a, c, _, _ := setup(t, 0)
	ctx := ctxT(t)

	// Wrong key: 401 in OpenAI's shape.
	bad := newClient(t, a.URL, "llmq_nope")
	_, err := bad.Usage(ctx)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) {
		t.Fatalf("bad key: %T %v, want *client.Error", err, err)
	}
	if apiErr.StatusCode != 401 || apiErr.Type != "authentication_error" || apiErr.Code != client.CodeInvalidAPIKey || apiErr.Message == "" {
		t.Fatalf("bad key error = %+v", apiErr)
	}
	if !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "llmq_nope") {
		t.Fatalf("error text %q: want the status, never the key", err)
	}

	// Another tenant's job or a made-up id: 404.
	_, err = c.Jobs.Get(ctx, "job_doesnotexist")
	if !client.IsNotFound(err) {
		t.Fatalf("unknown job: %v, want a 404", err)
	}
	_, otherKey := a.Tenant("standard")
	j, err := newClient(t, a.URL, otherKey).Jobs.Create(ctx, chat("x", ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Jobs.Get(ctx, j.ID); !client.IsNotFound(err) {
		t.Fatalf("another tenant's job: %v, want a 404", err)
	}

	// A refused request names the param.
	_, err = c.Jobs.Create(ctx, &client.JobCreateParams{Body: map[string]any{"model": "no-such-model", "messages": []any{}}})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.HasPrefix(apiErr.Param, "body") {
		t.Fatalf("unknown model: %+v", err)
	}

	// The admin API without the admin token.
	_, err = c.Admin.ListTenants(ctx, nil)
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != client.CodeInvalidAdminToken {
		t.Fatalf("admin without token: %v", err)
	}

	// An id cannot change the route.
	if _, err := c.Jobs.Get(ctx, "../usage"); !client.IsNotFound(err) {
		t.Fatalf("Get(../usage) = %v, want a 404", err)
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	_, c, tenantID, _ := setup(t, 0)
	u, err := c.Usage(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if u.Tenant != tenantID || u.Tier != "standard" || u.BudgetUSD == nil || *u.BudgetUSD != 50 || u.RemainingUSD == nil || u.ResetsAt == 0 || u.Day == "" {
		t.Fatalf("usage = %+v", u)
	}
}

// TestRetryAfter429: the free tier allows 5 requests a second per key. A
// client that does not retry sees the 429 with its Retry-After; one that
// retries gets every answer.
func TestRetryAfter429(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("free")
	ctx := ctxT(t)

	burst := func(c *client.Client) (ok int, errs []error) {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for range 15 {
			wg.Go(func() {
				_, err := c.Usage(ctx)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ok++
				}
			})
		}
		wg.Wait()
		return ok, errs
	}

	_, errs := burst(newClient(t, a.URL, key, client.WithRetry(client.RetryPolicy{MaxRetries: 0})))
	if len(errs) == 0 {
		t.Fatal("15 requests at once within a limit of 5 per second: no 429")
	}
	var apiErr *client.Error
	if !errors.As(errs[0], &apiErr) || apiErr.StatusCode != 429 || apiErr.Type != "rate_limit_error" || apiErr.RetryAfter <= 0 || apiErr.RetryAfter > 2*time.Second {
		t.Fatalf("429 = %+v", errs[0])
	}

	_, key2 := a.Tenant("free")
	ok, errs := burst(newClient(t, a.URL, key2, client.WithRetry(client.RetryPolicy{MaxRetries: 20, MaxWait: 5 * time.Second})))
	if ok != 15 || len(errs) != 0 {
		t.Fatalf("with retries: %d answered, errors %v", ok, errs)
	}
}

func TestAdmin(t *testing.T) {
	t.Parallel()
	a, _, _, admin := setup(t, 1)
	ctx := ctxT(t)

	budget := 12.5
	ten, err := admin.Admin.CreateTenant(ctx, &client.TenantCreateParams{Name: "acme", Tier: "standard", DailyBudgetUSD: &budget})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ten.ID, "ten_") || ten.Name != "acme" || ten.DailyBudgetUSD == nil || *ten.DailyBudgetUSD != 12.5 || ten.WebhookSecret == "" {
		t.Fatalf("created tenant = %+v", ten)
	}
	if _, err := admin.Admin.CreateTenant(ctx, &client.TenantCreateParams{Name: "x", Tier: "gold"}); err == nil || !strings.Contains(err.Error(), "gold") {
		t.Fatalf("unknown tier: %v", err)
	}

	got, err := admin.Admin.GetTenant(ctx, ten.ID)
	if err != nil || got.ID != ten.ID || got.WebhookSecret != ten.WebhookSecret {
		t.Fatalf("GetTenant = %+v, %v", got, err)
	}

	premium := "premium"
	up, err := admin.Admin.UpdateTenant(ctx, ten.ID, &client.TenantUpdateParams{Tier: &premium})
	if err != nil || up.Tier != "premium" || up.DailyBudgetUSD == nil {
		t.Fatalf("UpdateTenant(tier) = %+v, %v; the budget should stay", up, err)
	}
	up, err = admin.Admin.UpdateTenant(ctx, ten.ID, &client.TenantUpdateParams{ClearDailyBudget: true})
	if err != nil || up.DailyBudgetUSD != nil || up.Tier != "premium" {
		t.Fatalf("UpdateTenant(clear budget) = %+v, %v", up, err)
	}

	var all []string
	for tn, err := range admin.Admin.AllTenants(ctx, &client.ListParams{Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, tn.ID)
	}
	if len(all) != 2 || all[0] != ten.ID { // acme and setup's tenant
		t.Fatalf("AllTenants = %v", all)
	}

	k, err := admin.Admin.CreateKey(ctx, ten.ID)
	if err != nil || !strings.HasPrefix(k.Key, "llmq_") || k.TenantID != ten.ID || !strings.HasPrefix(k.Key, k.Prefix) {
		t.Fatalf("CreateKey = %+v, %v", k, err)
	}
	exempt := true
	if up, err := admin.Admin.UpdateKey(ctx, k.ID, &client.KeyUpdateParams{APIExempt: &exempt}); err != nil || !up.APIExempt || up.Key != "" {
		t.Fatalf("UpdateKey(exempt) = %+v, %v", up, err)
	}
	keys, err := admin.Admin.ListKeys(ctx, ten.ID)
	if err != nil || len(keys.Data) != 1 || keys.Data[0].ID != k.ID || keys.Data[0].Key != "" || !keys.Data[0].APIExempt {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}
	if _, err := admin.Admin.UpdateKey(ctx, "key_nope", &client.KeyUpdateParams{APIExempt: &exempt}); !client.IsNotFound(err) {
		t.Fatalf("UpdateKey of an unknown key: %v", err)
	}

	// The new key works, and a job it runs appears in the usage report.
	tc := newClient(t, a.URL, k.Key)
	j, err := tc.Jobs.Create(ctx, chat("Say hi", "r1"))
	if err != nil {
		t.Fatal(err)
	}
	if j, err = tc.Jobs.Wait(ctx, j.ID, &client.WaitOptions{Interval: 20 * time.Millisecond}); err != nil || j.Status != "succeeded" {
		t.Fatalf("job = %+v, %v", j, err)
	}
	rep, err := admin.Admin.UsageReport(ctx, &client.UsageReportParams{TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Data) != 1 || rep.Data[0].TenantID != ten.ID || rep.Data[0].Requests != 1 || rep.Data[0].Model != "gpt-4o-mini" || rep.TotalCostUSD <= 0 {
		t.Fatalf("usage report = %+v", rep)
	}
	if _, err := admin.Admin.UsageReport(ctx, &client.UsageReportParams{Day: "yesterday"}); err == nil {
		t.Fatal("bad day accepted")
	}

	revoked, err := admin.Admin.RevokeKey(ctx, k.ID)
	if err != nil || revoked.RevokedAt == nil {
		t.Fatalf("RevokeKey = %+v, %v", revoked, err)
	}
	var apiErr *client.Error
	if _, err := tc.Usage(ctx); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Fatalf("revoked key: %v, want a 401", err)
	}
	if _, err := admin.Admin.RevokeKey(ctx, "key_nope"); !client.IsNotFound(err) {
		t.Fatalf("unknown key: %v", err)
	}
}
