package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/money"
)

// Tenant is a customer of llmq: its tier sets budget, priority and API rate.
type Tenant struct {
	ID   string
	Name string
	Tier string
	// BudgetOverride replaces the tier's daily budget when set.
	BudgetOverride *money.Micros
	// APIExempt exempts the tenant's keys from the per-key API rate limit.
	APIExempt bool
	// WebhookSecret signs the tenant's webhooks. Never log it.
	WebhookSecret string
	// WebhookSecretPrevious signs them too until PreviousUntil, after a rotation.
	WebhookSecretPrevious string
	PreviousUntil         *time.Time
	CreatedAt             time.Time
	UpdatedAt             time.Time
}

// WebhookSecrets are the secrets the tenant's deliveries at now are signed
// with: the previous one too during a rotation's overlap.
func (t *Tenant) WebhookSecrets(now time.Time) []string {
	if t.WebhookSecretPrevious != "" && t.PreviousUntil != nil && now.Before(*t.PreviousUntil) {
		return []string{t.WebhookSecret, t.WebhookSecretPrevious}
	}
	return []string{t.WebhookSecret}
}

const tenantColumns = `id, name, tier, budget_override_micros, api_exempt, webhook_secret,
	coalesce(webhook_secret_previous, ''), webhook_secret_previous_until, created_at, updated_at`

func scanTenant(r row) (*Tenant, error) {
	var t Tenant
	return &t, r.Scan(tenantDest(&t)...)
}

// tenantDest are tenantColumns' scan destinations, for wider rows too.
func tenantDest(t *Tenant) []any {
	return []any{&t.ID, &t.Name, &t.Tier, microsCol{&t.BudgetOverride}, &t.APIExempt, &t.WebhookSecret,
		&t.WebhookSecretPrevious, nullTimeCol{&t.PreviousUntil}, timeCol{&t.CreatedAt}, timeCol{&t.UpdatedAt}}
}

// TenantInsertParams are the fields of a new tenant.
type TenantInsertParams struct {
	ID             string // optional; a new ids.Tenant id when empty
	Name           string
	Tier           string
	BudgetOverride *money.Micros // nil: the tier's budget
	APIExempt      bool
}

// TenantInsert creates a tenant with a fresh random webhook secret.
func (db *DB) TenantInsert(ctx context.Context, p *TenantInsertParams) (*Tenant, error) {
	if err := required("TenantInsert", "Name", p.Name, "Tier", p.Tier); err != nil {
		return nil, err
	}
	now := db.d.ts(db.nowUTC())
	t, err := scanTenant(db.rw.queryRow(ctx, `
		INSERT INTO tenants (id, name, tier, budget_override_micros, api_exempt, webhook_secret, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
		RETURNING `+tenantColumns,
		cmp.Or(p.ID, ids.New(ids.Tenant)), p.Name, p.Tier, nullMicros(p.BudgetOverride), p.APIExempt, newWebhookSecret(), now))
	return t, db.d.wrap(err)
}

// newWebhookSecret has Stripe's "whsec_" prefix, so a leaked one is recognisable.
func newWebhookSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + hex.EncodeToString(b)
}

// TenantGetByID returns the tenant, or ErrNotFound.
func (db *DB) TenantGetByID(ctx context.Context, id string) (*Tenant, error) {
	return getOne(ctx, db.ro, scanTenant, "tenant", id, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, id)
}

// TenantListParams select a page of tenants.
type TenantListParams struct {
	After string // id of the last tenant of the previous page; "" for the first page
	Limit int    // default 20, at most 1000
	// APIExempt lists only the tenants exempt from the API rate limit.
	APIExempt bool
}

// TenantList returns a page of tenants.
func (db *DB) TenantList(ctx context.Context, p *TenantListParams) ([]*Tenant, bool, error) {
	q := `SELECT ` + tenantColumns + ` FROM tenants WHERE TRUE`
	if p.APIExempt {
		q += ` AND api_exempt = TRUE`
	}
	return page(ctx, db.ro, scanTenant, pageSQL(q, nil, p.After, true, p.Limit))
}

// TenantUpdateParams change a tenant; nil fields are left as they are.
type TenantUpdateParams struct {
	ID        string
	Name      *string
	Tier      *string
	APIExempt *bool
	// SetBudgetOverride writes BudgetOverride (nil clears it).
	SetBudgetOverride bool
	BudgetOverride    *money.Micros
}

// TenantUpdate applies p and returns the tenant, or ErrNotFound.
func (db *DB) TenantUpdate(ctx context.Context, p *TenantUpdateParams) (*Tenant, error) {
	var a args
	q := `UPDATE tenants SET updated_at = ` + a.add(db.d.ts(db.nowUTC()))
	if p.Name != nil {
		if err := required("TenantUpdate", "Name", *p.Name); err != nil {
			return nil, err
		}
		q += `, name = ` + a.add(*p.Name)
	}
	if p.Tier != nil {
		if err := required("TenantUpdate", "Tier", *p.Tier); err != nil {
			return nil, err
		}
		q += `, tier = ` + a.add(*p.Tier)
	}
	if p.APIExempt != nil {
		q += `, api_exempt = ` + a.add(*p.APIExempt)
	}
	if p.SetBudgetOverride {
		q += `, budget_override_micros = ` + a.add(nullMicros(p.BudgetOverride))
	}
	q += ` WHERE id = ` + a.add(p.ID) + ` RETURNING ` + tenantColumns
	t, err := getOne(ctx, db.rw, scanTenant, "tenant", p.ID, q, a...)
	return t, db.d.wrap(err)
}

// TenantRotateWebhookSecret gives the tenant a new webhook secret; the one
// it replaces still signs deliveries for overlap.
func (db *DB) TenantRotateWebhookSecret(ctx context.Context, id string, overlap time.Duration) (*Tenant, error) {
	if overlap < 0 {
		return nil, fmt.Errorf("store: TenantRotateWebhookSecret: negative overlap %v", overlap)
	}
	now := db.nowUTC()
	t, err := getOne(ctx, db.rw, scanTenant, "tenant", id, `UPDATE tenants SET webhook_secret_previous = webhook_secret,
			webhook_secret_previous_until = $2, webhook_secret = $3, updated_at = $4
		WHERE id = $1 RETURNING `+tenantColumns, id, db.d.ts(now.Add(overlap)), newWebhookSecret(), db.d.ts(now))
	return t, db.d.wrap(err)
}
