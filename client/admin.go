package client

import (
	"context"
	"encoding/json"
	"iter"
	"net/http"
	"net/url"
	"time"
)

// Usage returns the tenant's spend today: spent, reserved by jobs in
// flight, the budget, what remains and when the day resets.
func (c *Client) Usage(ctx context.Context) (*Usage, error) {
	return call[Usage](ctx, c, &request{method: http.MethodGet, path: "/v1/usage"})
}

// AdminService calls the admin API (/admin/v1) with the admin token.
type AdminService struct{ c *Client }

// TenantCreateParams describe a new tenant.
type TenantCreateParams struct {
	Name string `json:"name"`
	// Tier is a tier of the server's policy.
	Tier string `json:"tier"`
	// DailyBudgetUSD overrides the tier's daily budget. Defaults to the
	// tier's.
	DailyBudgetUSD *float64 `json:"daily_budget_usd,omitempty"`
	// APIExempt frees the tenant's keys from the tier's API rate limit.
	APIExempt bool `json:"api_exempt,omitempty"`
}

// CreateTenant creates a tenant. The answer carries the tenant's webhook
// secret.
func (s *AdminService) CreateTenant(ctx context.Context, p *TenantCreateParams) (*Tenant, error) {
	return call[Tenant](ctx, s.c, &request{method: http.MethodPost, path: "/admin/v1/tenants", admin: true, json: p})
}

// GetTenant returns a tenant, with its webhook secret.
func (s *AdminService) GetTenant(ctx context.Context, id string) (*Tenant, error) {
	return call[Tenant](ctx, s.c, &request{method: http.MethodGet, path: "/admin/v1/tenants/" + pathID(id), admin: true})
}

// ListParams page a list: Limit is the page size (1 to 1000 for tenants, 1
// to 100 for batches; the server's default, 20, when 0) and After the last
// id of the previous page.
type ListParams struct {
	Limit int
	After string
}

func (p *ListParams) query() url.Values {
	q := deref(p)
	return query(q.Limit, "after", q.After)
}

// ListTenants returns one page of tenants, newest first.
func (s *AdminService) ListTenants(ctx context.Context, p *ListParams) (*List[Tenant], error) {
	return call[List[Tenant]](ctx, s.c, &request{method: http.MethodGet, path: "/admin/v1/tenants", admin: true, query: p.query()})
}

// AllTenants iterates over every tenant, page after page.
func (s *AdminService) AllTenants(ctx context.Context, p *ListParams) iter.Seq2[*Tenant, error] {
	q := deref(p)
	return pages(&q.After, func() (*List[Tenant], error) { return s.ListTenants(ctx, &q) })
}

// TenantUpdateParams change a tenant; nil fields stay as they are.
type TenantUpdateParams struct {
	Name *string
	Tier *string
	// DailyBudgetUSD sets the tenant's own daily budget.
	DailyBudgetUSD *float64
	// ClearDailyBudget returns the tenant to its tier's budget; it wins
	// over DailyBudgetUSD.
	ClearDailyBudget bool
	APIExempt        *bool
}

// MarshalJSON writes the PATCH body: null for a cleared budget, absent for
// an unchanged one.
func (p TenantUpdateParams) MarshalJSON() ([]byte, error) {
	var budget any
	switch {
	case p.ClearDailyBudget:
		budget = json.RawMessage("null")
	case p.DailyBudgetUSD != nil:
		budget = *p.DailyBudgetUSD
	}
	return json.Marshal(struct {
		Name           *string `json:"name,omitempty"`
		Tier           *string `json:"tier,omitempty"`
		DailyBudgetUSD any     `json:"daily_budget_usd,omitempty"`
		APIExempt      *bool   `json:"api_exempt,omitempty"`
	}{p.Name, p.Tier, budget, p.APIExempt})
}

// UpdateTenant changes a tenant's name, tier, budget or API exemption.
func (s *AdminService) UpdateTenant(ctx context.Context, id string, p *TenantUpdateParams) (*Tenant, error) {
	return call[Tenant](ctx, s.c, &request{method: http.MethodPatch, path: "/admin/v1/tenants/" + pathID(id), admin: true, json: p})
}

// CreateKey creates an API key of a tenant. Its Key, the plaintext, is in
// this answer only: llmq keeps a hash.
func (s *AdminService) CreateKey(ctx context.Context, tenantID string) (*APIKey, error) {
	return call[APIKey](ctx, s.c, &request{method: http.MethodPost, path: "/admin/v1/tenants/" + pathID(tenantID) + "/keys", admin: true})
}

// ListKeys returns a tenant's keys, revoked ones included, without their
// plaintext.
func (s *AdminService) ListKeys(ctx context.Context, tenantID string) (*List[APIKey], error) {
	return call[List[APIKey]](ctx, s.c, &request{method: http.MethodGet, path: "/admin/v1/tenants/" + pathID(tenantID) + "/keys", admin: true})
}

// KeyUpdateParams change a key; nil fields stay as they are.
type KeyUpdateParams struct {
	// APIExempt frees the key from its tier's API rate limit (an internal
	// service's key), or puts it back under it.
	APIExempt *bool `json:"api_exempt,omitempty"`
}

// UpdateKey changes a key's settings; it applies from the key's next
// request.
func (s *AdminService) UpdateKey(ctx context.Context, keyID string, p *KeyUpdateParams) (*APIKey, error) {
	return call[APIKey](ctx, s.c, &request{method: http.MethodPatch, path: "/admin/v1/keys/" + pathID(keyID), admin: true, json: p})
}

// RevokeKey revokes a key at once; the key is refused from its next
// request on.
func (s *AdminService) RevokeKey(ctx context.Context, keyID string) (*APIKey, error) {
	return call[APIKey](ctx, s.c, &request{method: http.MethodDelete, path: "/admin/v1/keys/" + pathID(keyID), admin: true})
}

// UsageReportParams select the usage report; zero fields are left out.
type UsageReportParams struct {
	// Day is YYYY-MM-DD. Defaults to today (UTC).
	Day string
	// TenantID limits the report to one tenant.
	TenantID string
}

// UsageReport returns spend per tenant and model on one day, from the
// ledger.
func (s *AdminService) UsageReport(ctx context.Context, p *UsageReportParams) (*UsageReport, error) {
	q := deref(p)
	return call[UsageReport](ctx, s.c, &request{method: http.MethodGet, path: "/admin/v1/usage", admin: true,
		query: query(0, "day", q.Day, "tenant_id", q.TenantID)})
}

// Retention is what the server's retention would purge now (the policy's
// retention: finished jobs' bodies, files no running batch uses, the usage
// ledger's detail).
type Retention struct {
	// FinishedJobs is the policy's retention.finished_jobs ("0s": kept for
	// ever); JobsBefore the cut-off, absent when kept.
	FinishedJobs string `json:"finished_jobs"`
	JobsBefore   *int64 `json:"jobs_finished_before,omitempty"`
	// Jobs is how many finished jobs would lose their request and response.
	Jobs int64 `json:"jobs"`
	// Files is the policy's retention.files; FilesBefore the cut-off.
	Files       string `json:"files"`
	FilesBefore *int64 `json:"files_created_before,omitempty"`
	// FileCount and FileBytes are the files that would be deleted.
	FileCount int64 `json:"file_count"`
	FileBytes int64 `json:"file_bytes"`
	// Ledger is the policy's retention.ledger; LedgerBefore the cut-off.
	Ledger       string `json:"ledger"`
	LedgerBefore *int64 `json:"ledger_charged_before,omitempty"`
	// LedgerRows is how many usage ledger rows would be folded into daily
	// totals (the spend and usage reports keep them).
	LedgerRows int64 `json:"ledger_rows"`
}

// Retention says what the server's retention would purge now, purging
// nothing.
func (s *AdminService) Retention(ctx context.Context) (*Retention, error) {
	return call[Retention](ctx, s.c, &request{method: http.MethodGet, path: "/admin/v1/retention", admin: true})
}

// RotateWebhookSecret gives the tenant a new webhook secret; the previous
// one keeps signing deliveries beside it for overlap (0: stops at once; at
// most 720h), so receivers can move without missing one. The answer holds
// the new secret.
func (s *AdminService) RotateWebhookSecret(ctx context.Context, tenantID string, overlap time.Duration) (*Tenant, error) {
	return call[Tenant](ctx, s.c, &request{method: http.MethodPost, path: "/admin/v1/tenants/" + pathID(tenantID) + "/webhook_secret/rotate",
		admin: true, json: map[string]string{"overlap": overlap.String()}})
}
